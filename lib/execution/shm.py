"""The shared memory a run's buffers live in, and what a dead owner left there.

Each run of the ``cpu`` backend writes its inputs and output into a folder of
its own under :func:`shm_root` (``/dev/shm`` where it exists), named after
the process that owns it (``gpuhive-<pid>-...``); the characterisation's copy
file is named the same way. A run killed with SIGKILL cannot remove its
folder, so the next backend to start removes the folders of owners that no
longer exist (:func:`reclaim_orphans`): repeated crashes would otherwise fill
the machine's memory until reboot.

Shared memory is a file system of its own size, not the computer's memory: a
container's ``/dev/shm`` is often 64 MB. A process that writes a mapped file
past what its file system holds is killed with SIGBUS (a notebook's kernel
dies), so a run first finds a folder its buffers fit in (:func:`place`:
``/dev/shm``, else the temp dir), and every buffer is allocated whole before
anything is written to it (:func:`allocate`); where neither has room, either
says so in one line, with how to give it room. ``GPUHIVE_SHM_DIR`` names the
folder for the buffers.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path

from lib.execution.base import ExecutionError

#: The environment variable that names the folder shared buffers go in.
SHM_DIR_ENV = "GPUHIVE_SHM_DIR"
#: What a refusal for want of shared memory suggests.
ROOM_HINT = (f"a container's /dev/shm is often 64 MB: start it with a larger "
             f"--shm-size, or set {SHM_DIR_ENV} to a folder with room")


class SharedMemoryError(ExecutionError):
    """The folder of shared buffers has no room for a run's buffers."""


def shm_roots() -> list[str]:
    """The folders shared buffers may go in, the first preferred:
    ``$GPUHIVE_SHM_DIR`` alone where set, else ``/dev/shm`` (where writable)
    and then the temp dir, a file system on disk whose page cache serves the
    same mappings where ``/dev/shm`` has no room.

    Raises:
        SharedMemoryError: ``GPUHIVE_SHM_DIR`` is not a writable folder.
    """
    chosen = os.environ.get(SHM_DIR_ENV)
    if chosen:
        if not (os.path.isdir(chosen) and os.access(chosen, os.W_OK)):
            raise SharedMemoryError(f"{SHM_DIR_ENV}={chosen}: not a writable folder")
        return [chosen]
    out = ["/dev/shm"] if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else []
    return out + [tempfile.gettempdir()]


def shm_root() -> str:
    """The preferred folder of shared buffers (:func:`shm_roots`)."""
    return shm_roots()[0]


def place(nbytes: float, what: str) -> str:
    """The first folder of :func:`shm_roots` with room for ``nbytes`` of
    buffers (one whose room the OS does not say counts as having it), chosen
    before anything is written.

    Raises:
        SharedMemoryError: none has room; one line naming ``what``, each
            folder's free bytes and the way to give it room.
    """
    roots = shm_roots()
    free = {root: free_bytes(root) for root in roots}
    for root in roots:
        if free[root] is None or nbytes <= free[root]:
            return root
    where = " and ".join(f"{_mb(free[r])} in {r}" for r in roots)
    raise SharedMemoryError(f"{what} needs {_mb(nbytes)} of shared memory, and "
                            f"{where} is free ({ROOM_HINT})")


def free_bytes(root: str) -> int | None:
    """Bytes free to this user in the file system of ``root`` (None where the
    OS does not say)."""
    try:
        st = os.statvfs(root)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def allocate(path: str, nbytes: int, what: str) -> None:
    """Make the file at ``path`` ``nbytes`` long with every page allocated
    now (``posix_fallocate``), so that writing to its mapping cannot run out
    of room later and kill the writer with SIGBUS.

    Raises:
        SharedMemoryError: the file system has no room for it (the file is
            removed).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        if nbytes and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise  # a file system that cannot allocate ahead keeps its size
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise SharedMemoryError(
                f"{what} needs {_mb(nbytes)} of shared memory in "
                f"{os.path.dirname(path)}, which has no room for it "
                f"({ROOM_HINT})") from None
        raise
    os.close(fd)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.0f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:,.1f} kB"


#: Names of what a run leaves in :func:`shm_root` while it lives: the run's
#: folder and the characterisation's copy file, each carrying the owner's pid.
_OWNED = re.compile(r"^gpuhive-(?:copy-)?(\d+)(?:-.*|\.bin)$")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def reclaim_orphans(root: str | None = None) -> list[str]:
    """Remove the run folders and files whose owning process is gone (a run
    killed with SIGKILL cannot clean up after itself); return their paths."""
    removed = []
    entries = []
    for base in ([root] if root else shm_roots()):
        try:
            entries += list(Path(base).iterdir())
        except OSError:
            continue
    for path in entries:
        m = _OWNED.match(path.name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(str(path))
    return removed
