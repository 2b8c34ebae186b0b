"""What this computer's operating system says about it: memory and caches.

The ``local-cpu`` profile (:func:`lib.platform.machines.local_cpu_machine`)
is built from these readings; each returns a safe default, with the reason,
where the system does not say.
"""

from __future__ import annotations

import os


def last_level_cache(root: str = "/sys/devices/system/cpu/cpu0/cache"
                     ) -> tuple[float, str]:
    """The largest (last-level) cache of CPU 0 as the operating system
    reports it: ``(bytes, where it came from)``; ``(0.0, why not)`` where
    the system does not say (the cache term of the cost model is then off).
    """
    best, where = 0.0, f"not found under {root}: the cache term is off"
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return best, where
    for name in entries:
        if not name.startswith("index"):
            continue
        try:
            level = int(_read(f"{root}/{name}/level"))
            size = _read(f"{root}/{name}/size")
            kind = _read(f"{root}/{name}/type")
            shared = _read(f"{root}/{name}/shared_cpu_list")
        except (OSError, ValueError):
            continue
        unit = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1:].upper(), 1)
        try:
            nbytes = float(size.rstrip("KkMmGg")) * unit
        except ValueError:
            continue
        if kind != "Instruction" and nbytes > best:
            best = nbytes
            where = (f"read from {root}/{name}: level {level} {kind.lower()} "
                     f"cache of {size}, shared by CPUs {shared}")
    return best, where


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read().strip()


def host_memory_bytes() -> float:
    """This computer's physical memory, bytes (8 GiB where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8.0 * 2**30


def available_memory_bytes(meminfo: str = "/proc/meminfo") -> float | None:
    """Memory a new allocation can have without swapping (``MemAvailable``),
    bytes; None where the OS does not say."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        return None
    return None
