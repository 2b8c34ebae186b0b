"""The shared memory a run's buffers live in, and what a dead owner left there.

Each run of the ``cpu`` backend writes its inputs and output into a folder of
its own under :func:`shm_root` (``/dev/shm`` where it exists), named after
the process that owns it (``gpuhive-<pid>-...``); the characterisation's copy
file is named the same way. A run killed with SIGKILL cannot remove its
folder, so the next backend to start removes the folders of owners that no
longer exist (:func:`reclaim_orphans`): repeated crashes would otherwise fill
the machine's memory until reboot.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path


def shm_root() -> str:
    """Where shared buffers live: ``/dev/shm`` where writable, else the temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else tempfile.gettempdir()


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
    base = Path(root or shm_root())
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
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
