"""Induced load on this computer's cores: processes spinning on one core.

The two-GPU server's heterogeneity is induced (a clock lock); on a computer's
cores it is induced by :class:`CoreLoad`: processes that spin on one core, so
a worker of ours pinned there gets a share of it. They are started so that
they are no descendants of ours and sit in their own session, as another
user's processes would: capacity telemetry
(:func:`lib.platform.telemetry.local_cpu_snapshot`) then finds them itself.
The evaluation's loaded states and ``gpuhive characterise --induce-load`` use
it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

#: The spinning process of :class:`CoreLoad`. It forks once more and the
#: middle process exits, so the spinner is no descendant of ours: capacity
#: telemetry counts it as it counts another user's process (our own process
#: tree is ours, not contention). It pins itself to its core, prints its pid,
#: and stops when its time is up or our process is gone.
_SPINNER = """
import os, sys, time
parent, core, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if os.fork():
    os._exit(0)
os.setsid()
if hasattr(os, "sched_setaffinity"):
    try:
        os.sched_setaffinity(0, {core})
    except OSError:
        pass
print(os.getpid(), flush=True)
os.close(1)
os.close(2)
end, n = time.monotonic() + seconds, 0
while time.monotonic() < end:
    n += 1
    if n % 200000 == 0:
        try:
            os.kill(parent, 0)
        except OSError:
            break
"""


class CoreLoad:
    """``procs`` processes spinning on one core: real background load, from
    processes that are not ours (``start`` and ``stop`` may also be called
    directly, as ``load-mid`` does)."""

    def __init__(self, core: int, seconds: float = 3600.0, procs: int = 1):
        self.core, self.seconds, self.count = core, seconds, procs
        self.pids: list[int] = []

    def start(self) -> None:
        """Start the spinning processes (no-op if they run)."""
        if self.pids:
            return
        for _ in range(self.count):
            out = subprocess.run(
                [sys.executable, "-c", _SPINNER, str(os.getpid()), str(self.core),
                 str(self.seconds)], capture_output=True, text=True, timeout=30,
                check=True)
            self.pids.append(int(out.stdout.split()[0]))
        time.sleep(0.3)

    def stop(self) -> None:
        """Kill the spinning processes and wait until they are gone."""
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        while any(os.path.exists(f"/proc/{pid}") for pid in self.pids) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        self.pids = []

    def __enter__(self) -> CoreLoad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
