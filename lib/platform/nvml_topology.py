"""How a computer's GPUs are connected, read through NVML.

Both the live machine (:func:`lib.platform.machines.nvml_machine`, which
turns the connections into peer links) and the live telemetry
(:func:`lib.platform.telemetry.nvml_snapshot`, which reports them beside each
device's state) read the same two things:

- the NVLinks: for each device, the active links and the bus id at each
  link's far end (``nvmlDeviceGetNvLinkState``,
  ``nvmlDeviceGetNvLinkRemotePciInfo``), so two devices are NVLink peers when
  one's links reach the other's bus, and how many links join them;
- otherwise the PCIe path: the level of the two devices' nearest common
  ancestor (``nvmlDeviceGetTopologyCommonAncestor``), one switch or several
  on one board, a host bridge, or across the CPUs' interconnect.

:func:`start` opens NVML for both, with one line where it cannot. Every
function takes the NVML module as an argument (``pynvml``, or a
recording replayed with pynvml's names, :class:`lib.platform.telemetry.RecordedNvml`),
so the same code is tested without a driver. A call that fails counts as no
link (an unknown PCIe path as the slowest class).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def start(nvml: Any, fail: type[Exception], prefix: str
          ) -> tuple[Any, type[BaseException]]:
    """(nvml, its error class): ``nvml`` (``pynvml`` where None) initialised.

    Raises:
        fail: ``"<prefix>: ..."``, nvidia-ml-py is not installed or NVML
            cannot start (no NVIDIA driver).
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            raise fail(f"{prefix}: nvidia-ml-py is not installed "
                       "(pip install 'gpuhive[gpu]')") from None
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error as exc:
        raise fail(f"{prefix}: cannot initialise NVML ({exc}); no NVIDIA driver "
                   "on this machine") from None
    return nvml, error


#: How two devices are connected, fastest first: the diagonal, an active
#: NVLink, a path through PCIe switches only, a path through a host bridge /
#: the CPU's root complex, a path across the SMP interconnect between sockets.
LINK_CLASSES = ("self", "nvlink", "pcie-switch", "pcie-host", "system")


def text(value: Any) -> str:
    """An NVML string (bytes in older bindings) as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def bus_key(bus_id: Any) -> tuple[int, int, int, int]:
    """``"00000000:17:00.0"`` and ``"0000:17:00.0"`` -> the same (domain, bus,
    device, function), so NVLink remote ids match local ids whatever the width."""
    value = text(bus_id).strip().lower()
    try:
        domain, bus, rest = value.split(":")
        dev, fn = rest.split(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return (-1, -1, -1, -1)


def topology_class(nvml: Any, level: int) -> str:
    """Map ``nvmlDeviceGetTopologyCommonAncestor``'s level onto LINK_CLASSES."""
    if level <= nvml.NVML_TOPOLOGY_MULTIPLE:   # same board, one or more switches
        return "pcie-switch"
    if level <= nvml.NVML_TOPOLOGY_NODE:       # host bridge, same CPU / NUMA node
        return "pcie-host"
    return "system"                            # across the SMP interconnect


def nvlink_peers(nvml: Any, handle: Any, error: type[BaseException]
                 ) -> dict[tuple[int, int, int, int], int]:
    """Bus id -> how many of this device's active NVLinks reach it."""
    peers: dict[tuple[int, int, int, int], int] = {}
    for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != \
                    nvml.NVML_FEATURE_ENABLED:
                continue
            far = bus_key(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except error:
            continue
        peers[far] = peers.get(far, 0) + 1
    return peers


def link_matrix(nvml: Any, handles: Sequence[Any], buses: Sequence[Any],
                error: type[BaseException]
                ) -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[int, ...], ...]]:
    """(classes, nvlinks): ``classes[i][j]`` from :data:`LINK_CLASSES`, and
    ``nvlinks[i][j]`` the number of active NVLinks joining i and j (the
    larger of what each side reports; 0 where none).

    Args:
        buses: each device's :func:`bus_key`, None where it could not be read.
    """
    n = len(handles)
    reach = [nvlink_peers(nvml, h, error) for h in handles]
    classes, counts = [], []
    for i in range(n):
        row, count = [], []
        for j in range(n):
            links = 0 if i == j else max(
                reach[i].get(buses[j], 0) if buses[j] is not None else 0,
                reach[j].get(buses[i], 0) if buses[i] is not None else 0)
            count.append(links)
            if i == j:
                row.append("self")
            elif links:
                row.append("nvlink")
            else:
                try:
                    level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i],
                                                                     handles[j])
                    row.append(topology_class(nvml, int(level)))
                except error:
                    row.append("system")   # unknown path: assume the slowest
        classes.append(tuple(row))
        counts.append(tuple(count))
    return tuple(classes), tuple(counts)
