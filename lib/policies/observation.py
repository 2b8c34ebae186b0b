"""The learned policy's observation: the task, and one row per device.

A machine is a *set* of devices, so the state is not a fixed-length vector with
a slot per device but two parts (:func:`encode_state`):

- the task row, :data:`TASK_FIELDS` (``TASK_FEATURES`` entries): the task and
  a few facts about the set as a whole (how many usable devices, NCCL, how
  much of it is linked peer to peer, how loaded it is);
- one device row per usable device, :data:`DEVICE_FIELDS`
  (``DEVICE_FEATURES`` entries): the device's figures, its telemetry, its
  links to the others, and what the task asks of it (the whole task's
  arithmetic over the device's peak, its bytes over its bandwidth and over its
  host link, at unit efficiency: figures of the device and the task, not of the
  cost model's fitted efficiencies).

Devices Gate 1 would refuse (unhealthy ones) are not in the set; the rows come in
device index order, and :attr:`State.devices` says which device each row is.
Any number of devices from 1 to :data:`~lib.contract.MAX_DEVICES` works; the
rows do not depend on their order except through the order itself.

Part of the policy, not of the contract. :data:`STATE_VERSION` is written into
every policy file, so a file trained on another layout is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lib.contract import DTYPES, KINDS, MAX_DEVICES, TaskSpec
from lib.platform.workloads import like_of, whole_work, workload

#: Version of the layout below; version 1 had eight fixed device slots.
STATE_VERSION = 2
#: The most devices a state holds (the contract's bound on a decision).
STATE_MAX_DEVICES = MAX_DEVICES
#: Share of Gate 1's memory margin kept free (fraction of free memory usable).
_FREE = 0.9

TASK_FIELDS: tuple[tuple[str, str], ...] = tuple(
    [(f"task.kind.{k}", f"1 if kind is {k}, else 0") for k in KINDS]
    + [(f"task.dtype.{d}", f"1 if dtype is {d}, else 0") for d in DTYPES]
    + [(f"task.log2_dim{i}", f"log2 of the kind's dimension {i} / 32 (0 if the "
                             f"kind has fewer)") for i in range(3)]
    + [("task.log2_split", "log2 of the divisible dimension's size / 32"),
       ("task.merge_sum", "1 if partial results add up (sum merge), else 0"),
       ("task.log_flops", "(log10 of the whole task's FLOP - 9) / 3"),
       ("task.log_bytes", "(log10 of its device-memory traffic in bytes - 7) / 3"),
       ("task.log_io", "(log10 of its host bytes in and out - 7) / 3"),
       ("set.log2_devices", "log2 of the number of usable devices / 4"),
       ("set.nccl", "1 if the machine has NCCL, else 0"),
       ("set.p2p_pairs", "fraction of pairs of usable devices linked peer to peer"),
       ("set.mean_util", "mean live utilisation of the usable devices"),
       ("set.cpu", "fraction of the usable devices that are CPU cores")]
)
DEVICE_FIELDS: tuple[tuple[str, str], ...] = (
    ("log_peak", "(log10 of peak FLOP/s for the task's dtype - 12) / 3"),
    ("log_mem_bw", "(log10 of memory bandwidth in B/s - 11) / 2"),
    ("log_mem", "(log10 of memory in bytes - 10) / 2"),
    ("log_host_bw", "(log10 of host link bandwidth in B/s - 10) / 2"),
    ("log_host_lat", "log10 of host link latency in s + 5"),
    ("cpu", "1 if the device is a CPU core, else 0"),
    ("util", "the share of the device a shard would not get now: 1 - capacity "
             "where telemetry measured capacity, else the live utilisation "
             "(0 without telemetry)"),
    ("free_frac", "free memory over total memory (1 without telemetry)"),
    ("peer_frac", "fraction of the other usable devices reachable peer to peer"),
    ("log_peer_bw", "mean over those links of (log10 bandwidth in B/s - 10) / 2"),
    ("nvlink_frac", "fraction of the other usable devices reachable over NVLink"),
    ("peak_frac", "peak FLOP/s over the usable devices' sum"),
    ("bw_frac", "memory bandwidth over the usable devices' sum"),
    ("t_compute", "(log10 of the task's FLOP / (peak x (1 - util)), s + 4) / 3"),
    ("t_memory", "(log10 of its memory traffic / (bandwidth x (1 - util)) + 4) / 3"),
    ("fit", "log10 of (free memory x 0.9) / the whole task's footprint, / 3"),
    ("t_in", "(log10 of host latency + the task's input bytes / host bw + 4) / 3"),
    ("t_out", "(log10 of host latency + its output bytes / host bw + 4) / 3"),
    ("t_fixed", "(log10 of host latency + the bytes every shard needs / host bw "
                "+ 4) / 3"),
    ("cost_split", "(log10 of max(t_compute, t_memory) + t_in + t_out, s + 4) / 3: "
                   "the whole task on the device in split mode, unit efficiency"),
    ("cost_pipe", "(log10 of max(t_compute, t_memory, t_in, t_out), s + 4) / 3: "
                  "the same, copies overlapping compute (pipelined)"),
)
TASK_FEATURES = len(TASK_FIELDS)
DEVICE_FEATURES = len(DEVICE_FIELDS)
#: Every entry of a state, ``(name, meaning)``: the task row, then one device
#: row (``device.<field>``), repeated once per usable device.
STATE_FIELDS: tuple[tuple[str, str], ...] = TASK_FIELDS + tuple(
    (f"device.{name}", text) for name, text in DEVICE_FIELDS)
#: Device rows whose features are the task's own (zeroed by the
#: ``no-telemetry`` and ``no-topology`` ablations: see lib.policies.learned).
TELEMETRY_FIELDS = ("util", "free_frac")
TOPOLOGY_FIELDS = ("log_host_bw", "log_host_lat", "peer_frac", "log_peer_bw",
                   "nvlink_frac")
#: Device entries that are a task scalar minus a device constant (the first
#: three after the figures); the last five are not.
SEPARABLE_FIELDS = ("t_compute", "t_memory", "fit")
TASK_DEVICE_FIELDS = ("t_in", "t_out", "t_fixed", "cost_split", "cost_pipe")
_D = {name: i for i, (name, _) in enumerate(DEVICE_FIELDS)}
_T = {name: i for i, (name, _) in enumerate(TASK_FIELDS)}


@dataclass(frozen=True)
class State:
    """What the policy sees of (task, machine, telemetry).

    Attributes:
        task: ``(TASK_FEATURES,)`` float64, :data:`TASK_FIELDS`.
        devices: ``(k, DEVICE_FEATURES)`` float64, one row per usable device,
            :data:`DEVICE_FIELDS`.
        index: ``(k,)`` the machine's index of each row's device.
    """

    task: np.ndarray
    devices: np.ndarray
    index: tuple[int, ...]


class MachineView:
    """The task-independent part of the state for one machine under one
    telemetry snapshot (and a dtype): arrays over the usable devices, so a
    policy deciding many tasks computes them once.

    Attributes:
        index: the usable devices (healthy), in index order.
        static: ``(k, DEVICE_FEATURES)`` the rows with their task entries
            still zero.
        task_set: the ``set.*`` entries of the task row, in order.
        peak_eff, bw_eff: peak FLOP/s and memory B/s times ``1 - util``.
        host_bw, host_lat: host link bandwidth and latency.
        free: free memory in bytes.
    """

    def __init__(self, machine: Any, telemetry: Any, dtype: str) -> None:
        n = len(machine.devices)
        healthy = [telemetry is None or bool(telemetry.healthy[i]) for i in range(n)]
        self.index = tuple(i for i in range(n) if healthy[i])
        idx = self.index
        k = len(idx)
        devs = [machine.devices[i] for i in idx]
        # What a shard of ours would get of each device: its capacity where
        # telemetry measured it (a core shared with one spinning process is
        # half free, though 100 % utilised), else 1 - utilisation. ``util``
        # below is the share it would not get.
        util = np.array([1.0 - 1.0 / telemetry.slowdown(i) if telemetry is not None
                         else 0.0 for i in idx])
        free = np.array([float(telemetry.free_bytes[i]) if telemetry is not None
                         else d.mem_bytes for i, d in zip(idx, devs, strict=True)])
        peak = np.array([d.peak_flops(dtype) for d in devs])
        bw = np.array([d.mem_bw for d in devs])
        mem = np.array([d.mem_bytes for d in devs])
        links = [machine.host_link(i) for i in idx]
        self.host_bw = np.array([lk.bandwidth for lk in links])
        self.host_lat = np.array([lk.latency for lk in links])
        idle_frac = np.maximum(1.0 - np.minimum(util, 0.99), 0.01)
        self.peak_eff, self.bw_eff, self.free = peak * idle_frac, bw * idle_frac, free
        self.inv_peak, self.inv_bw = 1.0 / self.peak_eff, 1.0 / self.bw_eff
        self.inv_host_bw = 1.0 / self.host_bw
        #: ``log10`` of ``peak_eff``, ``bw_eff`` and ``free x 0.9``: what the
        #: separable entries subtract from the task's own logarithms.
        self.log_peak_eff = np.log10(self.peak_eff)
        self.log_bw_eff = np.log10(self.bw_eff)
        self.log_room = np.log10(np.maximum(free * _FREE, 1.0))
        x = np.zeros((k, DEVICE_FEATURES))
        x[:, _D["log_peak"]] = (np.log10(peak) - 12.0) / 3.0
        x[:, _D["log_mem_bw"]] = (np.log10(bw) - 11.0) / 2.0
        x[:, _D["log_mem"]] = (np.log10(mem) - 10.0) / 2.0
        x[:, _D["log_host_bw"]] = (np.log10(self.host_bw) - 10.0) / 2.0
        x[:, _D["log_host_lat"]] = np.log10(self.host_lat) + 5.0
        x[:, _D["cpu"]] = [d.kind == "cpu" for d in devs]
        x[:, _D["util"]] = util
        x[:, _D["free_frac"]] = free / mem
        links, pairs = _links(machine, idx)
        x[:, [_D["peer_frac"], _D["log_peer_bw"], _D["nvlink_frac"]]] = links
        x[:, _D["peak_frac"]] = peak / peak.sum() if k else 0.0
        x[:, _D["bw_frac"]] = bw / bw.sum() if k else 0.0
        self.static = x
        self.task_set = np.array([
            math.log2(max(k, 1)) / 4.0, float(bool(machine.nccl)),
            pairs / (k * (k - 1)) if k > 1 else 0.0,
            float(util.mean()) if k else 0.0,
            float(np.mean([d.kind == "cpu" for d in devs])) if k else 0.0])


#: Link entries per (machine, usable devices), for the last machines seen: a
#: machine is frozen, and its links cost k^2 lookups.
_LINKS: dict[tuple[int, tuple[int, ...]], tuple[Any, np.ndarray, int]] = {}


def _links(machine: Any, idx: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """``(k, 3)`` ``peer_frac``, ``log_peer_bw``, ``nvlink_frac`` of the
    usable devices ``idx``, and the number of ordered linked pairs."""
    key = (id(machine), idx)
    hit = _LINKS.get(key)
    if hit is not None and hit[0] is machine:
        return hit[1], hit[2]
    k = len(idx)
    out = np.zeros((k, 3))
    pairs = 0
    for a in range(k):
        peers, nvlink, logs = 0, 0, []
        for b in range(k):
            if a == b:
                continue
            link = machine.peer(idx[a], idx[b])
            if link is not None and link.p2p:
                peers += 1
                logs.append((math.log10(link.bandwidth) - 10.0) / 2.0)
                nvlink += link.kind == "nvlink"
        pairs += peers
        out[a] = (peers / (k - 1) if k > 1 else 0.0,
                  sum(logs) / len(logs) if logs else 0.0,
                  nvlink / (k - 1) if k > 1 else 0.0)
    if len(_LINKS) >= 256:
        _LINKS.clear()
    _LINKS[key] = (machine, out, pairs)
    return out, pairs


def encode_task(task: TaskSpec, out: np.ndarray, whole: Any = None) -> None:
    """Write the task's own entries of the task row (those before ``set.*``)
    into ``out``, a zeroed array at least :data:`TASK_FEATURES` long
    (``whole``: the task's work as one shard, where the caller has it)."""
    # A registered kind shows as the built-in kind it behaves like (the
    # policy has seen those only); its work counts below are its own.
    out[KINDS.index(like_of(task.kind))] = 1.0
    out[len(KINDS) + DTYPES.index(task.dtype)] = 1.0
    base = len(KINDS) + len(DTYPES)
    for i, size in enumerate(list(task.dims.values())[:3]):
        out[base + i] = math.log2(size) / 32.0
    out[base + 3] = math.log2(task.split_size) / 32.0
    out[_T["task.merge_sum"]] = float(task.merge == "sum")
    if whole is None:
        whole = whole_work(task)
    out[_T["task.log_flops"]] = (math.log10(max(whole.flops, 1.0)) - 9.0) / 3.0
    out[_T["task.log_bytes"]] = (math.log10(max(whole.mem_traffic, 1.0)) - 7.0) / 3.0
    out[_T["task.log_io"]] = (math.log10(max(whole.bytes_in + whole.bytes_out, 1.0))
                              - 7.0) / 3.0


def task_terms(task: TaskSpec, whole: Any = None
               ) -> tuple[float, float, float, float, float, float]:
    """The whole task's FLOP, memory traffic, host bytes in and out, bytes
    every shard needs, and footprint (what the device rows divide); ``whole``:
    its work as one shard, where the caller has it."""
    w = workload(task)
    whole = whole if whole is not None else whole_work(task)
    fixed = w.work(task, 1).bytes_in_fixed
    return (whole.flops, whole.mem_traffic, whole.bytes_in, whole.bytes_out,
            fixed, whole.footprint)


def task_logs(terms: tuple[float, ...]) -> tuple[float, float, float]:
    """``log10`` of the task's FLOP, memory traffic and footprint (at least
    one each): the task's part of the separable device entries."""
    return (math.log10(max(terms[0], 1.0)), math.log10(max(terms[1], 1.0)),
            math.log10(max(terms[5], 1.0)))


def task_device_columns(view: MachineView, terms: tuple[float, ...],
                        out: np.ndarray | None = None, *,
                        scaled: bool = True) -> np.ndarray:
    """``(5, k)``: the :data:`TASK_DEVICE_FIELDS` entries of every device row
    (those that are not a task scalar minus a device constant), written into
    ``out`` where given (a decision at a time: no allocations but one).
    ``scaled=False`` leaves them as log10 seconds, before ``(x + 4) / 3``
    (a caller that folds the scaling into its weights)."""
    flops, traffic, b_in, b_out, fixed, _ = terms
    cols = np.empty((5, len(view.index))) if out is None else out
    np.multiply.outer((b_in, b_out, fixed), view.inv_host_bw, out=cols[:3])
    cols[:3] += view.host_lat
    comp = np.maximum(max(flops, 1.0) * view.inv_peak,
                      max(traffic, 1.0) * view.inv_bw)
    np.add(comp, cols[0], out=cols[3])
    cols[3] += cols[1]
    np.maximum(cols[0], cols[1], out=cols[4])
    np.maximum(cols[4], comp, out=cols[4])
    np.log10(cols, out=cols)
    if scaled:
        cols += 4.0
        cols /= 3.0
    return cols


def device_rows(view: MachineView, terms: tuple[float, ...]) -> np.ndarray:
    """The device rows ``(k, DEVICE_FEATURES)`` for a task with
    :func:`task_terms` ``terms`` on ``view``."""
    lf, lm, lfoot = task_logs(terms)
    x = view.static.copy()
    x[:, _D["t_compute"]] = (lf - view.log_peak_eff + 4.0) / 3.0
    x[:, _D["t_memory"]] = (lm - view.log_bw_eff + 4.0) / 3.0
    x[:, _D["fit"]] = (view.log_room - lfoot) / 3.0
    x[:, [_D[n] for n in TASK_DEVICE_FIELDS]] = task_device_columns(view, terms).T
    return x


def encode_state(task: TaskSpec, machine: Any, telemetry: Any = None,
                 view: MachineView | None = None) -> State:
    """The state of (task, machine, telemetry) for set policies.

    Args:
        task: the task.
        machine: a :class:`lib.platform.machines.Machine` (duck-typed:
            ``devices``, ``host_link(i)``, ``peer(i, j)``, ``nccl``).
        telemetry: optional snapshot (``utilisation``, ``free_bytes``,
            ``healthy``).
        view: the machine's :class:`MachineView` for ``task.dtype`` where the
            caller keeps one.

    Returns:
        A :class:`State`; entries are scaled to a few units.
    """
    view = view or MachineView(machine, telemetry, task.dtype)
    t = np.zeros(TASK_FEATURES)
    encode_task(task, t)
    t[_T["set.log2_devices"]:] = view.task_set
    return State(task=t, devices=device_rows(view, task_terms(task)),
                 index=view.index)
