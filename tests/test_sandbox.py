"""The bubblewrap sandbox: confinement, limits and exec denial.

Every test starts real sandboxes; the module is skipped, with the reason from
:func:`lib.security.sandbox.available`, where none can start. One C++ program
(:data:`PROGRAM`) is compiled once inside the sandbox and plays every
untrusted role by its first argument.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from lib.security import sandbox
from lib.security.sandbox import SCRATCH, SandboxLimits, SandboxResult, run

REASON = sandbox.available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no sandbox: {REASON}")

MARKER = f"{SCRATCH}/marker"

PROGRAM = r"""
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

static char* TOUCH[] = {(char*)"touch", (char*)"MARKER", nullptr};

int main(int argc, char** argv) {
  std::string m = argc > 1 ? argv[1] : "";
  if (m == "sum") {
    long s = 0;
    for (int i = 1; i <= 100; i++) s += i;
    printf("sum=%ld\n", s);
  } else if (m == "threads") {
    std::vector<long> r(64);
    std::vector<std::thread> ts;
    for (int t = 0; t < 64; t++) ts.emplace_back([&r, t] { r[t] = t; });
    for (auto& t : ts) t.join();
    long s = 0;
    for (long v : r) s += v;
    printf("threads=%ld\n", s);
  } else if (m == "system") {
    int rc = system("touch MARKER");
    printf("system=%d errno=%d\n", rc, errno);
  } else if (m == "execv") {
    execv("/usr/bin/touch", TOUCH);
    printf("execv errno=%d\n", errno);
  } else if (m == "fork") {
    pid_t p = fork();
    if (p == 0) { execv("/usr/bin/touch", TOUCH); _exit(9); }
    if (p > 0) waitpid(p, nullptr, 0);
    printf("fork=%d errno=%d\n", (int)p, errno);
  } else if (m == "execveat") {
    int fd = open("/usr/bin/touch", O_RDONLY);
    char* env[] = {nullptr};
    syscall(SYS_execveat, fd, "", TOUCH, env, AT_EMPTY_PATH);
    printf("execveat errno=%d\n", errno);
  } else if (m == "thread_exec") {
    std::thread t([] {
      execv("/usr/bin/touch", TOUCH);
      printf("thread errno=%d\n", errno);
    });
    t.join();
  } else if (m == "kill_supervisor") {
    kill(getppid(), SIGKILL);
    usleep(200000);
    execv("/usr/bin/touch", TOUCH);
    printf("execv errno=%d\n", errno);
  } else if (m == "supervisor_mem") {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", (int)getppid());
    int fd = open(path, O_RDWR);
    printf("mem fd=%d errno=%d\n", fd, errno);
  } else if (m == "spin") {
    for (volatile unsigned long x = 0;; x++) {}
  } else if (m == "hog") {
    std::vector<char*> v;
    for (;;) { char* p = new char[64 << 20]; memset(p, 1, 64 << 20); v.push_back(p); }
  } else {
    return 2;
  }
  return 0;
}
""".replace("MARKER", MARKER)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled :data:`PROGRAM`, built by g++ inside the sandbox."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ to build the test program")
    build = tmp_path_factory.mktemp("build")
    (build / "prog.cpp").write_text(PROGRAM)
    result = run(
        ["g++", "-O1", "-pthread", "-o", "prog", "prog.cpp"],
        scratch=build, allow_exec=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    return build / "prog"


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    path = tmp_path / "scratch"
    path.mkdir()
    return path


def _with_program(program: Path, scratch: Path) -> str:
    shutil.copy2(program, scratch / "prog")
    return f"{SCRATCH}/prog"


def _visible_folder() -> Path:
    """A new host folder outside /tmp, so visible (read-only) inside."""
    if not os.access("/var/tmp", os.W_OK):
        pytest.skip("no writable /var/tmp for a folder visible inside")
    return Path(tempfile.mkdtemp(prefix="gh_sandbox_test_", dir="/var/tmp"))


def _sh(script: str, scratch: Path, **kwargs) -> SandboxResult:
    return run(["sh", "-c", script], scratch=scratch, allow_exec=True, **kwargs)


def test_available_here():
    assert sandbox.available() is None


def test_writes_only_inside_scratch(scratch: Path, tmp_path: Path):
    # /var/tmp is visible inside (read-only); the test's /tmp folder is not.
    visible = _visible_folder()
    try:
        seen = _sh(f"ls -d {visible} && echo x > {visible}/f", scratch)
        assert seen.stdout.decode().strip() == str(visible)
        assert seen.returncode != 0
        assert b"Read-only file system" in seen.stderr
        assert not (visible / "f").exists()
        hidden = _sh(f"echo x > {tmp_path}/f", scratch)
        assert hidden.returncode != 0
        assert not (tmp_path / "f").exists()
        inside = _sh(f"echo in > {SCRATCH}/f && echo tmp > /tmp/t && cat /tmp/t",
                     scratch)
        assert inside.returncode == 0, inside.stderr
        assert inside.stdout == b"tmp\n"
        assert (scratch / "f").read_text() == "in\n"
    finally:
        shutil.rmtree(visible)


def test_root_cannot_remount_the_host_writable(scratch: Path):
    probe = Path("/etc/gh_sandbox_remount_probe")
    try:
        result = _sh(f"mount -o remount,rw,bind /etc; touch {probe}", scratch)
        assert result.returncode != 0
        assert not probe.exists()
    finally:
        probe.unlink(missing_ok=True)


def test_hide_empties_a_folder(scratch: Path):
    secret = _visible_folder()
    try:
        (secret / "key").write_text("s3cret")
        shown = _sh(f"cat {secret}/key", scratch)
        assert shown.stdout == b"s3cret"
        hidden = _sh(f"ls -A {secret}; cat {secret}/key", scratch, hide=[secret])
        assert hidden.stdout == b""
        assert hidden.returncode != 0
    finally:
        shutil.rmtree(secret)


def test_a_folder_hidden_inside_an_exposed_one_stays_hidden(scratch: Path,
                                                          tmp_path: Path):
    """GPUHive's home inside a checkout under /tmp (exposed again past the
    fresh /tmp): its files stay out of sight, and the sandbox starts."""
    checkout = tmp_path / "checkout"
    home = checkout / ".gpuhive"
    home.mkdir(parents=True)
    (checkout / "code.py").write_text("x")
    (home / "key").write_text("s3cret")
    seen = _sh(f"ls -A {checkout}; ls -A {home}; cat {home}/key", scratch,
               hide=[home], expose=[checkout])
    assert seen.stdout.split() == [b".gpuhive", b"code.py"]
    assert seen.returncode != 0 and b"s3cret" not in seen.stdout


def test_network_is_unreachable(scratch: Path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        port_hex = f":{port:04X} ".encode()
        assert port_hex in Path("/proc/net/tcp").read_bytes()
        python = os.path.realpath(sys.executable)
        client = run(
            [python, "-I", "-S", "-c",
             f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"],
            scratch=scratch,
        )  # fmt: skip
        assert client.returncode != 0
        assert b"Error" in client.stderr
        with pytest.raises(BlockingIOError):
            server.accept()
        # The sandbox has its own network namespace: the listener is not in it.
        table = _sh("cat /proc/net/tcp", scratch)
        assert table.returncode == 0
        assert port_hex not in table.stdout


def test_environment_is_cleared(scratch: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GH_SANDBOX_SECRET", "leak")
    result = run(["env"], scratch=scratch, env={"GH_EXTRA": "1"})
    env = dict(line.split("=", 1) for line in result.stdout.decode().splitlines())
    assert "GH_SANDBOX_SECRET" not in env
    assert env["GH_EXTRA"] == "1"
    assert env["HOME"] == SCRATCH
    assert set(env) <= {"PATH", "LANG", "HOME", "TMPDIR", "PWD", "GH_EXTRA"}


def test_cpu_limit_stops_a_spin(program: Path, scratch: Path):
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=10)
    result = run([_with_program(program, scratch), "spin"], scratch=scratch,
                 limits=limits)
    assert result.killed_by_limit == "cpu"
    assert result.signal == signal.SIGXCPU
    assert not result.timed_out
    assert result.wall_seconds < 5


def test_wall_limit_stops_a_sleep_and_its_children(scratch: Path):
    start = time.monotonic()
    result = _sh("sleep 987.25 & sleep 30", scratch,
                 limits=SandboxLimits(wall_seconds=0.5))
    assert result.timed_out
    assert result.killed_by_limit == "wall"
    assert time.monotonic() - start < 5

    def survivors() -> list[str]:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if cmdline.read_bytes() == b"sleep\x00987.25\x00":
                    found.append(cmdline.parent.name)
        return found

    deadline = time.monotonic() + 3
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert survivors() == []


def test_memory_limit_stops_a_hog(program: Path, scratch: Path):
    limits = SandboxLimits(memory_bytes=256 << 20, wall_seconds=10)
    result = run([_with_program(program, scratch), "hog"], scratch=scratch,
                 limits=limits)
    assert result.returncode != 0
    assert result.killed_by_limit == "memory"
    assert result.wall_seconds < 5


def test_output_over_the_cap_is_cut_and_flagged(scratch: Path):
    limits = SandboxLimits(output_bytes=1000)
    big = run(["head", "-c", "100000", "/dev/zero"], scratch=scratch, limits=limits)
    assert big.truncated
    assert big.killed_by_limit == "output"
    assert len(big.stdout) + len(big.stderr) == 1000
    small = run(["head", "-c", "999", "/dev/zero"], scratch=scratch, limits=limits)
    assert not small.truncated
    assert small.returncode == 0
    assert len(small.stdout) == 999


def test_file_size_limit(scratch: Path):
    limits = SandboxLimits(file_bytes=1 << 20)
    result = _sh(f"head -c 3000000 /dev/zero > {SCRATCH}/big", scratch, limits=limits)
    assert result.killed_by_limit == "file"
    assert (scratch / "big").stat().st_size <= 1 << 20


def test_stdin_reaches_the_command(scratch: Path):
    data = os.urandom(300_000)
    result = run(["cat"], scratch=scratch, stdin=data)
    assert result.returncode == 0
    assert result.stdout == data


def test_a_normal_program_runs_without_exec(program: Path, scratch: Path):
    prog = _with_program(program, scratch)
    assert run([prog, "sum"], scratch=scratch).stdout == b"sum=5050\n"
    assert run([prog, "threads"], scratch=scratch).stdout == b"threads=2016\n"


@pytest.mark.parametrize("mode", ["system", "execv", "fork", "execveat",
                                  "thread_exec", "kill_supervisor"])
def test_exec_is_denied(program: Path, scratch: Path, mode: str):
    result = run([_with_program(program, scratch), mode], scratch=scratch)
    assert not (scratch / "marker").exists()
    if mode != "kill_supervisor":
        assert result.returncode == 0, result.stderr
        assert b"errno=1\n" in result.stdout  # EPERM


def test_exec_works_when_allowed(program: Path, scratch: Path):
    # The same program, so test_exec_is_denied sees the filter, not a bug.
    result = run([_with_program(program, scratch), "execv"], scratch=scratch,
                 allow_exec=True)
    assert result.returncode == 0, result.stderr
    assert (scratch / "marker").exists()


def test_supervisor_memory_is_closed(program: Path, scratch: Path):
    result = run([_with_program(program, scratch), "supervisor_mem"], scratch=scratch)
    assert result.stdout == b"mem fd=-1 errno=13\n"  # EACCES


def test_launcher_errors_are_named(scratch: Path):
    result = run(["no-such-program"], scratch=scratch)
    assert result.returncode == 127
    assert result.stderr.startswith(b"sandbox: no-such-program")


def test_bad_arguments_are_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="scratch"):
        run(["true"], scratch=tmp_path / "missing")
    with pytest.raises(ValueError, match="argv"):
        run([], scratch=tmp_path)
    with pytest.raises(ValueError, match="cpu_seconds"):
        SandboxLimits(cpu_seconds=0)


@pytest.mark.parametrize("mode", ["system", "execv", "fork", "execveat",
                                  "thread_exec"])
def test_kill_denied_stops_the_program_at_the_attempt(program: Path, scratch: Path,
                                                      mode: str):
    """With ``kill_denied`` the attempt itself ends the run (the spot check
    refuses on it) instead of failing with EPERM for the program to ignore."""
    result = run([_with_program(program, scratch), mode], scratch=scratch,
                 kill_denied=True)
    assert not (scratch / "marker").exists()
    assert result.returncode in (128 + 31, 128 + 9), result  # SIGSYS or SIGKILL
    assert b"errno=" not in result.stdout  # it never got to carry on
    assert run([_with_program(program, scratch), "threads"], scratch=scratch,
               kill_denied=True).stdout == b"threads=2016\n"


def test_an_exit_status_a_signal_gave_is_named():
    """A sandboxed child a signal ended says which (NVRTC crashing on a
    source nested too deep exited with 139, and said nothing more)."""
    from lib.security.sandbox import exit_status

    assert exit_status(139) == "139 (SIGSEGV)"
    assert exit_status(134) == "134 (SIGABRT)"
    assert exit_status(-9) == "-9 (SIGKILL)"
    assert exit_status(1) == "1" and exit_status(3) == "3"
