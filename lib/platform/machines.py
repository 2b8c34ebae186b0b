"""Machine profiles: the devices, their links, and where each number came from.

A profile names its devices (peak FP32, FP64 and tensor FLOP/s, memory, memory
bandwidth), each device's link to the host, and the peer links between devices
(kind, bandwidth, latency, whether peer-to-peer copies work). Every number is
tagged ``measured`` or ``estimated`` with a note saying where it came from, and
the two are never pooled: :meth:`Machine.provenance_table` lists them apart.

Shipped profiles (``lib/platform/profiles/*.json`` plus two built at load time):

- ``hetero-4``: four genuinely different GPUs (H100 SXM, A100 80GB SXM, V100
  SXM2, T4) with a mixed NVLink/PCIe topology. Simulated; the default.
- ``uni-server-1gpu``: one GPU; every multi-device action is masked out.
- ``uni-server-2gpu-induced``: two identical cards, one clock-locked, labelled
  *induced*. Induced heterogeneity scales arithmetic and memory throughput
  together, so it cannot show kernel-dependent device ordering.
- ``local-cpu``: this computer's cores as devices, run for real by the ``cpu``
  backend (one worker process per core).
- ``nvml``: read from the live machine through NVML (needs a driver).

Units throughout: FLOP/s, bytes, bytes/s, seconds.

Why one module: the datasheet catalog, the dataclasses built from it, the
profile format (whose every field is checked against what it means: a
catalog entry, a link kind, a finite positive rate), the live machines
(``local-cpu``, ``nvml``, built from the same catalog) and the registry that
:func:`load_machine` resolves names through are one vocabulary. Split, the
format would need the catalog and the registry the format, and each would
import the other.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from lib.contract import BLOCKS, DEFAULT_BLOCK, MAX_DEVICES, MEASURING_BACKENDS
from lib.platform.hostinfo import cpu_quota, host_memory_bytes, last_level_cache
from lib.platform.nvml_topology import bus_key, link_matrix, start, text

GB = 1e9
TB = 1e12

PROVENANCES = ("measured", "estimated")

#: ``scheme://host:port`` in a device's name; :attr:`Device.identity` keeps
#: the scheme and host and leaves the port out.
_PORT = re.compile(r"(\w+://[^\s():]+):\d+")


class MachineError(ValueError):
    """An unknown or malformed machine profile (the message names it)."""


# --------------------------------------------------------------------------
# Published datasheet figures (dense tensor rates; per-direction link rates)

#: name -> (fp32, fp64, tensor fp16, tensor bf16, memory bytes, memory B/s,
#:          host link kind, NVLink per-direction B/s or 0)
#: FP32, tensor, memory and interconnect from NVIDIA datasheets; FP64 likewise.
#: A tensor rate of 0 means the card has no such tensor path (T4 has no BF16).
GPU_CATALOG: dict[str, tuple[float, float, float, float, float, float, str, float]] = {
    "V100 SXM2 32GB": (15.7 * TB, 7.8 * TB, 125 * TB, 0.0, 32 * GB, 900 * GB,
                       "pcie3", 150 * GB),
    "A100 40GB PCIe": (19.5 * TB, 9.7 * TB, 312 * TB, 312 * TB, 40 * GB,
                       1555 * GB, "pcie4", 300 * GB),
    "A100 80GB SXM": (19.5 * TB, 9.7 * TB, 312 * TB, 312 * TB, 80 * GB, 2039 * GB,
                      "pcie4", 300 * GB),
    "H100 SXM": (66.9 * TB, 34.0 * TB, 989 * TB, 989 * TB, 80 * GB, 3350 * GB,
                 "pcie5", 450 * GB),
    "H100 PCIe": (51.2 * TB, 25.6 * TB, 756 * TB, 756 * TB, 80 * GB, 2000 * GB,
                  "pcie5", 300 * GB),
    "H200 SXM": (67.0 * TB, 34.0 * TB, 989 * TB, 989 * TB, 141 * GB, 4800 * GB,
                 "pcie5", 450 * GB),
    "L4": (30.3 * TB, 0.49 * TB, 121 * TB, 121 * TB, 24 * GB, 300 * GB, "pcie4",
           0.0),
    "T4": (8.1 * TB, 0.25 * TB, 65 * TB, 0.0, 16 * GB, 320 * GB, "pcie3", 0.0),
    "A10": (31.2 * TB, 0.98 * TB, 125 * TB, 125 * TB, 24 * GB, 600 * GB, "pcie4",
            0.0),
    "RTX 3090": (35.6 * TB, 0.56 * TB, 71 * TB, 71 * TB, 24 * GB, 936 * GB,
                 "pcie4", 56.25 * GB),
    "RTX 4090": (82.6 * TB, 1.29 * TB, 165.2 * TB, 165.2 * TB, 24 * GB,
                 1008 * GB, "pcie4", 0.0),
}

#: Per-direction bandwidth and latency of host/peer link kinds (estimates:
#: PCIe x16 per-direction signalling rates; latencies typical of a DMA launch).
LINK_KINDS: dict[str, tuple[float, float]] = {
    "pcie3": (16 * GB, 10e-6),
    "pcie4": (32 * GB, 8e-6),
    "pcie5": (64 * GB, 6e-6),
    "nvlink": (300 * GB, 3e-6),
    "shm": (8 * GB, 50e-6),
    # between processes of one host, and between hosts (estimates until
    # lib.execution.dask_measure.characterise_network measures them)
    "loopback": (2 * GB, 100e-6),
    "network": (1.25 * GB, 200e-6),
}


# --------------------------------------------------------------------------
# Schema

@dataclass(frozen=True)
class Device:
    """One device of a machine.

    Attributes:
        index: position in the machine (what ``Decision.gpus`` refers to).
        name: model name (``"H100 SXM"``, ``"CPU core 0"``).
        kind: ``"gpu"`` or ``"cpu"``.
        peak_fp32, peak_fp64: peak FLOP/s.
        tensor_fp16, tensor_bf16: dense tensor-core FLOP/s (0 where absent).
        mem_bytes: device memory, bytes.
        mem_bw: memory bandwidth, bytes/s.
        max_block: largest thread block the device accepts.
        cache_bytes: last-level cache, bytes (0: unknown); see
            :func:`lib.costmodel.model.cache_factor`.
        provenance: field name -> ``"measured"`` or ``"estimated"``.
        notes: field name -> where the number came from.
    """

    index: int
    name: str
    kind: str
    peak_fp32: float
    peak_fp64: float
    tensor_fp16: float
    tensor_bf16: float
    mem_bytes: float
    mem_bw: float
    max_block: int = 1024
    cache_bytes: float = 0.0
    provenance: Mapping[str, str] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for arithmetic in ``dtype`` (tensor path where it exists)."""
        if dtype == "fp64":
            return self.peak_fp64
        if dtype == "fp16":
            return max(self.tensor_fp16, self.peak_fp32)
        if dtype == "bf16":
            return max(self.tensor_bf16, self.peak_fp32)
        return self.peak_fp32

    @property
    def label(self) -> str:
        """``"2:V100 SXM2 32GB"``: index and name, for tables and errors."""
        return f"{self.index}:{self.name}"

    @cached_property
    def identity(self) -> str:
        """Twelve hex digits that change when the device at this index is
        another device: a digest of its kind, its name (a network address's
        port left out, since a local Dask cluster's workers get new ports
        each time it starts) and the figures the cost model prices it with,
        to three significant digits (a figure read live may wobble in its
        last digits). What a history learned of a device is kept under this,
        so it is never applied to a card a profile has since replaced."""
        name = _PORT.sub(r"\1", self.name)
        figures = (self.peak_fp32, self.peak_fp64, self.tensor_fp16,
                   self.tensor_bf16, self.mem_bw)
        text_ = "|".join([self.kind, name, *(f"{v:.3g}" for v in figures)])
        return hashlib.blake2b(text_.encode(), digest_size=6).hexdigest()


@dataclass(frozen=True)
class Link:
    """A host link or a peer link.

    Attributes:
        kind: ``pcie3``/``pcie4``/``pcie5``/``nvlink``/``shm``.
        bandwidth: bytes/s per direction.
        latency: seconds per transfer.
        p2p: whether devices can copy to each other directly over it.
        provenance: ``"measured"`` or ``"estimated"``.
        note: where the numbers came from.
    """

    kind: str
    bandwidth: float
    latency: float
    p2p: bool = False
    provenance: str = "estimated"
    note: str = ""


@dataclass(frozen=True)
class Machine:
    """A set of devices and the links between them.

    Attributes:
        name: profile name.
        description: one paragraph for humans.
        devices: the devices, index order.
        host_links: each device's link to host memory, index order.
        peers: ``(i, j)`` with ``i < j`` -> peer link; absent pairs go via host.
        host_mem_bw: host memory bandwidth for host-side merges, bytes/s.
        simulated: no real devices stand behind the profile.
        induced: heterogeneity is induced (clock locks, load), not different cards.
        nccl: NCCL is available for all-reduce merges.
        real_backends: execution backends that run for real on such a machine.
    """

    name: str
    description: str
    devices: tuple[Device, ...]
    host_links: tuple[Link, ...]
    peers: Mapping[tuple[int, int], Link]
    host_mem_bw: float = 50 * GB
    simulated: bool = True
    induced: bool = False
    nccl: bool = False
    real_backends: tuple[str, ...] = ()

    @property
    def n(self) -> int:
        """Number of devices."""
        return len(self.devices)

    @property
    def cluster(self) -> bool:
        """Whether the devices are a Dask cluster's workers (see Eq. (1))."""
        return self.real_backends == ("dask",)

    @property
    def heterogeneous(self) -> bool:
        """Whether its devices differ in what they can do: in a throughput,
        their memory, or their link to the host (a card clock-locked to 60 %,
        or one behind a network link, differs from its twin of the same
        name). Peer links are left out: they join pairs, not devices."""
        def can(d: Device, h: Link) -> tuple[float, ...]:
            return (d.peak_fp32, d.peak_fp64, d.tensor_fp16, d.tensor_bf16,
                    d.mem_bytes, d.mem_bw, h.bandwidth, h.latency)
        return len({can(d, h) for d, h in zip(self.devices, self.host_links,
                                              strict=True)}) > 1

    def block_for(self, devices: Sequence[int], preferred: int = DEFAULT_BLOCK
                  ) -> int:
        """``preferred`` threads a block, or where one of ``devices`` cannot
        launch so many (a profile's ``max_block``), the largest block of
        :data:`~lib.contract.BLOCKS` every one of them can."""
        limit = min((self.devices[i].max_block for i in devices), default=preferred)
        return max((b for b in BLOCKS if b <= min(limit, preferred)),
                   default=BLOCKS[0])

    def host_link(self, i: int) -> Link:
        """Device ``i``'s link to the host."""
        return self.host_links[i]

    def peer(self, i: int, j: int) -> Link | None:
        """The peer link between ``i`` and ``j``, or ``None`` (via host only)."""
        return self.peers.get((min(i, j), max(i, j)))

    def provenance_table(self) -> list[dict[str, Any]]:
        """Every number of the profile with its provenance, one row each."""
        rows: list[dict[str, Any]] = []
        for d in self.devices:
            for f in ("peak_fp32", "peak_fp64", "tensor_fp16", "tensor_bf16",
                      "mem_bytes", "mem_bw"):
                rows.append({"what": f"device {d.label} {f}",
                             "value": getattr(d, f),
                             "provenance": d.provenance.get(f, "estimated"),
                             "note": d.notes.get(f, "")})
        for i, link in enumerate(self.host_links):
            rows.append({"what": f"host link {i} ({link.kind}) bandwidth",
                         "value": link.bandwidth, "provenance": link.provenance,
                         "note": link.note})
        for (i, j), link in sorted(self.peers.items()):
            rows.append({"what": f"peer link {i}-{j} ({link.kind}) bandwidth",
                         "value": link.bandwidth, "provenance": link.provenance,
                         "note": link.note})
        return rows

    def summary(self) -> str:
        """One line per device, for ``gpuhive doctor`` and notebooks."""
        tag = " (simulated)" if self.simulated else ""
        tag += " (induced heterogeneity)" if self.induced else ""
        lines = [f"{self.name}{tag}: {self.n} device(s)"]
        for d, h in zip(self.devices, self.host_links, strict=True):
            figures = (f"fp32 {d.peak_fp32 / TB:7.2f} TFLOP/s  "
                       f"mem {d.mem_bytes / GB:6.1f} GB  bw {d.mem_bw / GB:7.1f} GB/s  "
                       f"host {h.kind} {h.bandwidth / GB:.0f} GB/s")
            if len(d.label) > 22:  # a Dask worker's address: a line of its own
                lines += [f"  {d.label}", f"  {'':<22} {figures}"]
            else:
                lines.append(f"  {d.label:<22} {figures}")
        for (i, j), link in sorted(self.peers.items()):
            lines.append(f"  peer {i}-{j}: {link.kind} {link.bandwidth / GB:.0f} GB/s"
                         f"{' p2p' if link.p2p else ''}")
        return "\n".join(lines)


# --------------------------------------------------------------------------
# Building profiles

def _catalog_near(model: str) -> list[str]:
    """Catalog names ``model`` may have meant: the same but for case and
    spacing, else those whose words hold all of its words or are all among
    them ("H100": both H100s; "NVIDIA Tesla T4": the T4). Never a mere close
    spelling: an RTX 4080 is not an RTX 4090, nor an L40S an L4."""
    def squash(name: str) -> str:
        return "".join(name.lower().split())
    same = [m for m in GPU_CATALOG if squash(m) == squash(model)]
    words = set(model.lower().split())
    near = [m for m in GPU_CATALOG if words and (
        words <= set(m.lower().split()) or set(m.lower().split()) <= words)]
    return same or near


def catalog_device(index: int, model: str, note: str = "") -> Device:
    """A device from :data:`GPU_CATALOG` (a profile's ``scale`` applies later:
    :func:`_scaled`)."""
    if model not in GPU_CATALOG:
        near = _catalog_near(model)
        hint = f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""
        raise MachineError(f"unknown GPU model {model!r}{hint}. The catalog has "
                           f"{', '.join(GPU_CATALOG)}; a card it lacks is "
                           "described by its figures (name, peak_fp32, mem_bytes, "
                           "mem_bw)")
    fp32, fp64, t16, tbf, mem, bw, _, _ = GPU_CATALOG[model]
    src = note or f"NVIDIA datasheet ({model})"
    fields = ("peak_fp32", "peak_fp64", "tensor_fp16", "tensor_bf16", "mem_bytes",
              "mem_bw")
    return Device(
        index=index, name=model, kind="gpu", peak_fp32=fp32, peak_fp64=fp64,
        tensor_fp16=t16, tensor_bf16=tbf, mem_bytes=mem, mem_bw=bw,
        provenance={f: "estimated" for f in fields},
        notes={f: src for f in fields},
    )


def link_of_kind(kind: str, *, bandwidth: float | None = None, p2p: bool = False,
                 note: str = "") -> Link:
    """A link with the default (estimated) rate of its kind."""
    if kind not in LINK_KINDS:
        raise MachineError(f"unknown link kind {kind!r}; expected one of "
                           f"{', '.join(LINK_KINDS)}")
    bw, lat = LINK_KINDS[kind]
    return Link(kind=kind, bandwidth=bandwidth or bw, latency=lat, p2p=p2p,
                provenance="estimated",
                note=note or f"{kind} per-direction rate (estimate)")


#: The fields of a profile, of one of its devices and of one of its peer
#: links; any other is refused (a misspelt field would silently leave the
#: stock figure in place).
PROFILE_FIELDS = ("name", "description", "simulated", "induced", "nccl",
                  "host_mem_bw", "real_backends", "devices", "peers")
#: A device's figures, each a number or ``{"value": N, "provenance":
#: "measured"|"estimated", "note": TEXT}``: they override the catalog's, or
#: describe a card the catalog lacks.
FIGURE_FIELDS = ("peak_fp32", "peak_fp64", "tensor_fp16", "tensor_bf16",
                 "mem_bytes", "mem_bw")
#: Figures a device without ``catalog`` must state.
REQUIRED_FIGURES = ("peak_fp32", "mem_bytes", "mem_bw")
#: Figures that may be 0 (the card has no such tensor path).
MAY_BE_ZERO = ("tensor_fp16", "tensor_bf16")
DEVICE_FIELDS = ("catalog", "name", "scale", "host_link", "note",
                 *FIGURE_FIELDS, "max_block", "cache_bytes")
HOST_LINK_FIELDS = ("kind", "bandwidth", "latency", "note")
PEER_FIELDS = ("a", "b", "kind", "bandwidth", "latency", "p2p", "note")
NUMBER_FIELDS = ("value", "provenance", "note")
#: FP64 of a card stated without it: 1/64 of FP32, the ratio of the
#: catalog's GDDR cards (L4, A10, RTX); a data-centre card states its own.
FP64_RATIO = 1 / 64


def _number(spec: Any, where: str, zero: bool = False) -> float:
    """A finite positive number (or ``{"value": number, ...}``); 0 too where
    ``zero``."""
    value = spec["value"] if isinstance(spec, Mapping) and "value" in spec else spec
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        expected = "a finite number >= 0" if zero else \
            "a finite positive number"
        raise MachineError(f"{where}: expected {expected}, got {value!r}")
    return float(value)


def _figure(spec: Any, where: str, zero: bool = False) -> tuple[float, str, str]:
    """(value, provenance, note) of a stated figure: a bare number is an
    estimate; ``{"value", "provenance", "note"}`` says where it came from."""
    if not isinstance(spec, Mapping):
        return _number(spec, where, zero), "estimated", "stated in the profile"
    spec = _fields(spec, NUMBER_FIELDS, where)
    if "value" not in spec:
        raise MachineError(f"{where}: no value (a figure is a number or "
                           '{"value": N, "provenance": "measured"})')
    provenance = _typed(spec, "provenance", str, "estimated", where)
    if provenance not in PROVENANCES:
        raise MachineError(f"{where}: provenance {provenance!r}; expected one "
                           f"of {', '.join(PROVENANCES)}")
    note = _typed(spec, "note", str, "", where) or \
        f"stated in the profile ({provenance})"
    return _number(spec["value"], where, zero), provenance, note


def _typed(obj: Mapping[str, Any], key: str, kind: type, default: Any,
           where: str) -> Any:
    """``obj[key]`` if it is a ``kind`` (no bool for an int), else ``default``
    when absent; MachineError naming ``where`` and the field otherwise."""
    if key not in obj:
        return default
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {bool: "true or false", int: "a whole number",
                    str: "a string", list: "a list"}[kind]
        raise MachineError(f"{where}: {key} must be {expected}, got {value!r}")
    return value


def _fields(obj: Any, known: tuple[str, ...], where: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise MachineError(f"{where}: expected a JSON object, got "
                           f"{type(obj).__name__}")
    unknown = [k for k in obj if k not in known]
    if unknown:
        raise MachineError(f"{where}: unknown field {unknown[0]!r} (a profile "
                           f"knows {', '.join(known)})")
    return obj


def _link(spec: Any, where: str, *, p2p: bool = False,
          default_note: str = "") -> Link:
    """A link from a kind's name, or ``{"kind", "bandwidth", "latency",
    "note"}`` (the kind's estimates where a number is not stated)."""
    spec = {"kind": spec} if isinstance(spec, str) else \
        _fields(spec, HOST_LINK_FIELDS, where)
    if "kind" not in spec:
        raise MachineError(f"{where}: no 'kind' (one of {', '.join(LINK_KINDS)})")
    note = _typed(spec, "note", str, "", where) or default_note
    try:
        base = link_of_kind(_typed(spec, "kind", str, "", where), p2p=p2p,
                            note=note)
    except MachineError as exc:
        raise MachineError(f"{where}: {exc}") from None
    stated = {key: _figure(spec[key], f"{where} {key}")
              for key in ("bandwidth", "latency") if key in spec}
    if not stated:
        return base
    # the provenance table lists a link by its bandwidth
    return replace(base,
                   bandwidth=stated.get("bandwidth", (base.bandwidth,))[0],
                   latency=stated.get("latency", (base.latency,))[0],
                   provenance=stated.get("bandwidth", (0, "estimated"))[1],
                   note=note or "; ".join(f"{key} {why}" for key, (_, _, why)
                                          in stated.items()))


def _device(i: int, d: Any, where: str) -> tuple[Device, Link]:
    """Device ``i`` of a profile: a catalog card (whose figures the object
    may override) or a card described by its own figures."""
    at = f"{where} device {i}"
    d = _fields(d, DEVICE_FIELDS, at)
    scale = _number(d["scale"], f"{at} scale") if "scale" in d else 1.0
    if scale > MAX_SCALE:
        raise MachineError(f"{at}: scale {scale!r} is more than {MAX_SCALE:g} "
                           "(a clock lock slows a card down)")
    note = _typed(d, "note", str, "", at)
    try:
        if "catalog" in d:
            model = _typed(d, "catalog", str, "", at)
            base = catalog_device(i, model, note)
            default_link = GPU_CATALOG[model][6]
        else:
            missing = [f for f in ("name", *REQUIRED_FIGURES) if f not in d]
            if missing:
                raise MachineError(
                    f"no catalog and no {missing[0]} (a device is "
                    '{"catalog": MODEL}, one of ' + ", ".join(GPU_CATALOG)
                    + ", or states name, " + ", ".join(REQUIRED_FIGURES) + ")")
            base = None
            default_link = "pcie4"
        device = _stated_device(i, d, base, at)
        if scale != 1.0:
            device = _scaled(device, scale, note)
        host = _link(d.get("host_link", default_link), f"{at} host_link",
                     default_note="" if "host_link" in d or base is not None
                     else "pcie4 assumed: the profile names no host link "
                          "(estimate)")
    except MachineError as exc:
        text = str(exc)
        raise MachineError(text if text.startswith(at) else f"{at}: {text}") \
            from None
    return device, host


def _stated_device(i: int, d: Mapping[str, Any], base: Device | None,
                   at: str) -> Device:
    """``base`` (a catalog card, or nothing) with the figures ``d`` states."""
    values: dict[str, float] = {}
    provenance: dict[str, str] = dict(base.provenance) if base else {}
    notes: dict[str, str] = dict(base.notes) if base else {}
    for f in FIGURE_FIELDS:
        if f in d:
            values[f], provenance[f], notes[f] = _figure(
                d[f], f"{at} {f}", zero=f in MAY_BE_ZERO)
        elif base is not None:
            values[f] = getattr(base, f)
        elif f == "peak_fp64":
            values[f] = values["peak_fp32"] * FP64_RATIO
            provenance[f] = "estimated"
            notes[f] = "not stated: 1/64 of FP32 assumed (estimate)"
        else:   # a tensor path the profile does not state: none
            values[f] = 0.0
            provenance[f] = "estimated"
            notes[f] = "not stated: no tensor path assumed"
    max_block = _typed(d, "max_block", int, base.max_block if base else 1024, at)
    if not BLOCKS[0] <= max_block <= BLOCKS[-1]:
        raise MachineError(f"{at}: max_block {max_block} is outside "
                           f"{BLOCKS[0]}-{BLOCKS[-1]} (the blocks a decision can "
                           "choose; CUDA allows at most 1024 threads)")
    cache = 0.0
    if "cache_bytes" in d:
        cache, provenance["cache_bytes"], notes["cache_bytes"] = _figure(
            d["cache_bytes"], f"{at} cache_bytes")
    name = _typed(d, "name", str, base.name if base else "", at)
    if not name.strip():
        raise MachineError(f"{at}: name must not be empty")
    return Device(index=i, name=name, kind="gpu", max_block=max_block,
                  cache_bytes=cache, provenance=provenance, notes=notes,
                  **values)


def _scaled(device: Device, scale: float, note: str) -> Device:
    """``device`` with its throughputs scaled (an induced slow-down)."""
    scaled = ("peak_fp32", "peak_fp64", "tensor_fp16", "tensor_bf16", "mem_bw")
    notes = dict(device.notes)
    for f in scaled:
        notes[f] = note or f"{notes.get(f, '')}; scaled by {scale:g} (induced)"
    return Device(**{**device.__dict__,
                     **{f: getattr(device, f) * scale for f in scaled},
                     "notes": notes})


#: The largest induced speed-up ``scale`` may state (a card overclocked).
MAX_SCALE = 2.0


def machine_from_json(obj: Mapping[str, Any], default_name: str | None = None
                      ) -> Machine:
    """Build a machine from a profile object (the format of ``lib/platform/profiles``).

    Devices are ``{"catalog": "H100 SXM"}`` (optionally ``"scale"`` and
    ``"note"`` for induced slow-downs, ``"host_link"`` for the link kind);
    peer links are ``{"a": 0, "b": 1, "kind": "nvlink", "bandwidth": 3e11,
    "p2p": true}``. Every field is checked: an unknown one, a wrong type, a
    number that is not finite and positive, no devices or more than
    :data:`~lib.contract.MAX_DEVICES`, or a pair of devices linked twice is a
    :class:`MachineError` naming the field.

    Args:
        default_name: the name when the profile states none (a file's stem).
    """
    where = "profile"
    if isinstance(obj, Mapping) and isinstance(obj.get("name"), str):
        where = f"profile {obj['name']}"
    obj = _fields(obj, PROFILE_FIELDS, where)
    name = _typed(obj, "name", str, default_name, where)
    if name is None:
        raise MachineError(f"{where}: no name (calibration and history are "
                           "kept under a machine's name)")
    if not name.strip() or name.startswith(".") or any(
            c in name for c in "/\\\0"):
        raise MachineError(f"{where}: name {name!r} must be a non-empty name "
                           "without a path separator or a leading dot")
    where = f"profile {name}"
    devices_in = _typed(obj, "devices", list, None, where)
    if not devices_in:
        raise MachineError(f"{where}: no devices (a list of "
                           '{"catalog": MODEL} objects)')
    if len(devices_in) > MAX_DEVICES:
        raise MachineError(f"{where}: {len(devices_in)} devices, more than a "
                           f"decision can address ({MAX_DEVICES})")
    pairs = [_device(i, d, where) for i, d in enumerate(devices_in)]
    devices = tuple(d for d, _ in pairs)
    host_links = tuple(h for _, h in pairs)
    peers: dict[tuple[int, int], Link] = {}
    for p in _typed(obj, "peers", list, [], where):
        p = _fields(p, PEER_FIELDS, f"{where} peer")
        for key in ("a", "b", "kind"):
            if key not in p:
                raise MachineError(f"{where} peer: no {key!r} (a peer link is "
                                   '{"a": i, "b": j, "kind": KIND})')
        a, b = (_typed(p, k, int, 0, f"{where} peer") for k in ("a", "b"))
        at = f"{where} peer {a}-{b}"
        if not (0 <= a < len(devices) and 0 <= b < len(devices)):
            raise MachineError(f"{at}: names a device that does not exist (the "
                               f"profile has devices 0-{len(devices) - 1})")
        if a == b:
            raise MachineError(f"{at}: links device {a} to itself")
        key = (min(a, b), max(a, b))
        if key in peers:
            raise MachineError(f"{at}: devices {key[0]} and {key[1]} are "
                               "linked twice")
        try:
            peers[key] = _link({k: v for k, v in p.items()
                                if k in HOST_LINK_FIELDS}, at,
                               p2p=_typed(p, "p2p", bool, True, at))
        except MachineError as exc:
            text = str(exc)
            raise MachineError(text if text.startswith(at) else f"{at}: {text}") \
                from None
    backends = _typed(obj, "real_backends", list, [], where)
    for b in backends:
        if b not in MEASURING_BACKENDS:
            raise MachineError(f"{where}: real_backends names {b!r}; expected "
                               f"some of {', '.join(MEASURING_BACKENDS)}")
    return Machine(
        name=name, description=_typed(obj, "description", str, "", where),
        devices=devices, host_links=host_links, peers=peers,
        host_mem_bw=_number(obj.get("host_mem_bw", 50 * GB),
                            f"{where} host_mem_bw"),
        simulated=_typed(obj, "simulated", bool, True, where),
        induced=_typed(obj, "induced", bool, False, where),
        nccl=_typed(obj, "nccl", bool, False, where),
        real_backends=tuple(backends),
    )


def local_cpu_machine(n: int | None = None) -> Machine:
    """This computer's cores as devices (estimates until ``characterise`` runs).

    Args:
        n: number of core-devices; default the cores this process may use, at
            most 8: those it may run on, and no more than its control group's
            CPU quota gives whole (a container of two CPUs' time on a host of
            64 cores has two).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    quota = cpu_quota()
    usable = cores if quota is None else max(1, min(cores, math.floor(quota)))
    n = max(1, min(n or usable, 8))
    limited = (f" (a CPU quota of {quota:g} of the {cores} cores it may run on, "
               "set by its control group)" if usable < cores else "")
    mem_total, (cache, cache_note) = host_memory_bytes(), last_level_cache()
    note = "estimate: 2.5 GHz x 16 fp32 FLOP/cycle (one AVX2 FMA unit)"
    fields = ("peak_fp32", "peak_fp64", "tensor_fp16", "tensor_bf16",
              "mem_bytes", "mem_bw")
    devices = tuple(
        Device(index=i, name=f"CPU core {i}", kind="cpu", peak_fp32=40e9,
               peak_fp64=20e9, tensor_fp16=0.0, tensor_bf16=0.0,
               mem_bytes=mem_total / n, mem_bw=8 * GB, cache_bytes=cache,
               provenance={**{f: "estimated" for f in fields},
                           "cache_bytes": "measured" if cache else "estimated"},
               notes={"peak_fp32": note, "peak_fp64": note,
                      "mem_bytes": "host memory divided among cores",
                      "mem_bw": "estimate: one core's streaming bandwidth",
                      "cache_bytes": cache_note})
        for i in range(n)
    )
    shm = link_of_kind("shm", note="shared-memory hand-off to a worker (estimate)")
    peers = {(i, j): link_of_kind("shm", p2p=True,
                                  note="shared memory between workers (estimate)")
             for i in range(n) for j in range(i + 1, n)}
    return Machine(
        name="local-cpu",
        description=f"This computer's CPU cores as {n} devices{limited}, each a "
                    "real worker process; the cpu backend measures them.",
        devices=devices, host_links=(shm,) * n, peers=peers, host_mem_bw=10 * GB,
        simulated=False, induced=False, nccl=False, real_backends=("cpu",),
    )


#: Per-direction rate of one NVLink of generations 2 to 4 (V100, A100,
#: H100: 50 GB/s both ways per link; NVIDIA datasheets), the estimate for a
#: link NVML counts.
NVLINK_LINK_BW = 25 * GB


def nvml_machine(nvml: Any = None) -> Machine:
    """The live machine read through NVML.

    A GPU whose name maps onto the catalog (:func:`catalog_model`) takes the
    catalog's figures; any other takes what NVML reports of it
    (:func:`nvml_device`). Memory is NVML's either way. Two GPUs joined by
    NVLink are peers at the links NVML counts; two under one PCIe switch or
    host bridge are peers where NVML says peer-to-peer reads work; others
    reach each other through the host.

    Args:
        nvml: the ``pynvml`` module (default), or an object with its names,
            such as :class:`lib.platform.telemetry.RecordedNvml`.

    Raises:
        MachineError: no NVML here, or a GPU NVML cannot describe.
    """
    nvml, error = start(nvml, MachineError, "nvml")
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(int(nvml.nvmlDeviceGetCount()))]
        if not handles:
            raise MachineError("nvml: NVML lists no GPU on this machine")
        devices, host_links, buses = [], [], []
        for i, handle in enumerate(handles):
            try:
                device, host = nvml_device(nvml, handle, i)
            except error as exc:
                raise MachineError(f"nvml: GPU {i}: NVML cannot read it ({exc})") \
                    from None
            devices.append(device)
            host_links.append(host)
            try:
                buses.append(bus_key(nvml.nvmlDeviceGetPciInfo(handle).busId))
            except error:
                buses.append(None)
        classes, nvlinks = link_matrix(nvml, handles, buses, error)
        peers = {}
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                link = _nvml_peer(nvml, handles, devices, host_links, i, j,
                                  classes[i][j], nvlinks[i][j])
                if link is not None:
                    peers[(i, j)] = link
    finally:
        try:
            nvml.nvmlShutdown()
        except error:
            pass
    return Machine(
        name="nvml", description="The live machine, read through NVML.",
        devices=tuple(devices), host_links=tuple(host_links), peers=peers,
        simulated=False, nccl=True, real_backends=("cuda",),
    )


def nvml_device(nvml: Any, handle: Any, index: int) -> tuple[Device, Link]:
    """One GPU read through NVML, and its link to the host.

    A card the catalog has takes its datasheet figures. Any other is
    described by what NVML reports: FP32 as CUDA cores x 2 x the highest SM
    clock, memory bandwidth as the bus width x the highest memory clock x 2
    (double data rate), FP64 by the compute capability's ratio (1/2 on the
    x.0 data-centre chips, 1/32 on 7.5, 1/64 on the rest), the tensor rates
    by the tensor-to-FP32 ratio of a catalog card of the same compute
    capability (:data:`TENSOR_RATIO_CARDS`; none where there is no such
    card), and the host link of its PCIe generation. Each such figure says
    so.
    """
    error = getattr(nvml, "NVMLError", Exception)
    name = text(nvml.nvmlDeviceGetName(handle))
    mem = float(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    model = catalog_model(name)
    if model is not None:
        dev = catalog_device(index, model)
        return (replace(dev, mem_bytes=mem,
                        provenance={**dev.provenance, "mem_bytes": "measured"},
                        notes={**dev.notes, "mem_bytes": "read through NVML"}),
                link_of_kind(GPU_CATALOG[model][6]))
    try:
        cores = int(nvml.nvmlDeviceGetNumGpuCores(handle))
        sm_hz = float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)) * 1e6
        mem_hz = float(nvml.nvmlDeviceGetMaxClockInfo(handle,
                                                      nvml.NVML_CLOCK_MEM)) * 1e6
        bus_bits = int(nvml.nvmlDeviceGetMemoryBusWidth(handle))
    except (error, AttributeError) as exc:
        raise MachineError(
            f"nvml: GPU {index} ({name!r}) is not in the catalog and NVML does "
            f"not report its cores, clocks and memory bus ({exc}); describe it "
            "by its figures in a profile of your own (the reference chapter's "
            "format)") from None
    if min(cores, sm_hz, mem_hz, bus_bits) <= 0:
        raise MachineError(f"nvml: GPU {index} ({name!r}) is not in the catalog "
                           f"and NVML reports {cores} cores, {sm_hz / 1e6:g} MHz, "
                           f"a {bus_bits}-bit bus at {mem_hz / 1e6:g} MHz; "
                           "describe it in a profile of your own")
    try:
        major, minor = (int(v) for v in
                        nvml.nvmlDeviceGetCudaComputeCapability(handle))
    except (error, AttributeError):
        major = minor = None
    if major is None:
        ratio, fp64_note = 1 / 64, "estimate: FP32 / 64 (compute capability unread)"
    else:
        ratio = 1 / 2 if minor == 0 and major >= 6 else \
            1 / 32 if (major, minor) == (7, 5) else 1 / 64
        fp64_note = (f"estimate: FP32 x 1/{round(1 / ratio)}, the ratio of "
                     f"compute capability {major}.{minor}")
    try:
        generation = int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
    except (error, AttributeError):
        generation = 0
    kind = f"pcie{generation}" if f"pcie{generation}" in LINK_KINDS else "pcie4"
    fp32 = cores * 2.0 * sm_hz
    tensor, tensor_notes = _tensor_by_architecture(
        fp32, name, None if major is None else (major, minor))
    fields = ("peak_fp32", "peak_fp64", "tensor_fp16", "tensor_bf16",
              "mem_bytes", "mem_bw")
    device = Device(
        index=index, name=name.removeprefix("NVIDIA ").strip() or name,
        kind="gpu", peak_fp32=fp32, peak_fp64=fp32 * ratio,
        tensor_fp16=tensor["tensor_fp16"], tensor_bf16=tensor["tensor_bf16"],
        mem_bytes=mem, mem_bw=bus_bits / 8 * mem_hz * 2,
        provenance={**{f: "estimated" for f in fields}, "mem_bytes": "measured"},
        notes={"peak_fp32": f"estimate from NVML: {cores} CUDA cores x 2 FLOP x "
                            f"{sm_hz / 1e6:g} MHz (highest SM clock)",
               "peak_fp64": fp64_note,
               **tensor_notes,
               "mem_bytes": "read through NVML",
               "mem_bw": f"estimate from NVML: {bus_bits}-bit bus x "
                         f"{mem_hz / 1e6:g} MHz (highest memory clock) x 2"})
    note = (f"PCIe {generation} read through NVML (rate: estimate)" if generation
            else "pcie4 assumed: NVML gives no PCIe generation (estimate)")
    return device, link_of_kind(kind, note=note)


#: Compute capability -> the catalog cards of that architecture whose
#: tensor-to-FP32 ratios stand for a card the catalog lacks: (data-centre and
#: workstation card, GeForce card or None). A GeForce card's tensor cores
#: accumulate in FP32 at half the rate of the others of its architecture
#: (NVIDIA's Ampere GA102 and Ada whitepapers), so it takes a GeForce card's
#: ratio where the catalog has one.
TENSOR_RATIO_CARDS: dict[tuple[int, int], tuple[str, str | None]] = {
    (7, 0): ("V100 SXM2 32GB", None), (7, 5): ("T4", None),
    (8, 0): ("A100 40GB PCIe", None), (8, 6): ("A10", "RTX 3090"),
    (8, 9): ("L4", "RTX 4090"), (9, 0): ("H100 SXM", None),
}


def _tensor_by_architecture(fp32: float, name: str,
                            capability: tuple[int, int] | None
                            ) -> tuple[dict[str, float], dict[str, str]]:
    """Dense FP16 and BF16 tensor rates of a card the catalog lacks, from its
    estimated FP32 rate and the tensor-to-FP32 ratio of a catalog card of the
    same compute capability (a ratio of 0: no such path, as on Volta and
    Turing for BF16); none where the capability is unread or not in
    :data:`TENSOR_RATIO_CARDS`. Returns the rates and their notes."""
    cards = TENSOR_RATIO_CARDS.get(capability) if capability else None
    if cards is None:
        why = ("compute capability unread" if capability is None else
               f"compute capability {capability[0]}.{capability[1]} has no "
               "catalog card to take the ratio from")
        note = f"not reported by NVML ({why}): no tensor path assumed"
        return ({"tensor_fp16": 0.0, "tensor_bf16": 0.0},
                {"tensor_fp16": note, "tensor_bf16": note})
    pro, geforce = cards
    model = geforce if geforce and "GEFORCE" in name.upper() else pro
    spec = GPU_CATALOG[model]
    rates, notes = {}, {}
    cc = f"{capability[0]}.{capability[1]}"
    for figure, rate in (("tensor_fp16", spec[2]), ("tensor_bf16", spec[3])):
        if rate <= 0:
            rates[figure] = 0.0
            notes[figure] = (f"estimate: no such tensor path, as on the {model} "
                             f"(compute capability {cc})")
            continue
        rates[figure] = fp32 * rate / spec[0]
        notes[figure] = (f"estimate: FP32 x {rate / spec[0]:.3g}, the dense "
                         f"tensor-to-FP32 ratio of the {model} (compute "
                         f"capability {cc})")
    return rates, notes


def _nvml_peer(nvml: Any, handles: list[Any], devices: list[Device],
               host_links: list[Link], i: int, j: int, how: str,
               nvlinks: int) -> Link | None:
    """The peer link between GPUs i and j as NVML sees it, or None (the two
    reach each other through the host)."""
    if how == "nvlink":
        bw = nvlinks * NVLINK_LINK_BW
        note = (f"{nvlinks} active NVLink(s) counted by NVML x "
                f"{NVLINK_LINK_BW / GB:g} GB/s per direction (estimate)")
        rated = [GPU_CATALOG[d.name][7] for d in (devices[i], devices[j])
                 if d.name in GPU_CATALOG and GPU_CATALOG[d.name][7] > 0]
        if rated and min(rated) < bw:
            bw = min(rated)
            note += f", capped at the card's NVLink rate, {bw / GB:g} GB/s"
        return link_of_kind("nvlink", bandwidth=bw, p2p=True, note=note)
    if how not in ("pcie-switch", "pcie-host"):
        return None
    error = getattr(nvml, "NVMLError", Exception)
    try:
        p2p = nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j],
                                          nvml.NVML_P2P_CAPS_INDEX_READ) \
            == nvml.NVML_P2P_STATUS_OK
        why = "NVML reports peer-to-peer reads"
    except (error, AttributeError):
        p2p = how == "pcie-switch"
        why = "NVML gives no peer-to-peer status; one PCIe switch assumed to allow it"
    if not p2p:
        return None
    slower = min(host_links[i], host_links[j], key=lambda lk: lk.bandwidth)
    return link_of_kind(slower.kind, p2p=True,
                        note=f"{how} path ({why}); the slower host link's rate "
                             "(estimate)")


#: NVML product names (upper case) -> catalog model, first match wins; a
#: name matches where it holds the key as a whole word, so an L40S is not
#: taken for an L4 nor an A10G for an A10.
NVML_NAMES: tuple[tuple[str, str], ...] = (
    ("H200", "H200 SXM"), ("H100 PCIE", "H100 PCIe"), ("H100", "H100 SXM"),
    ("A100-SXM4-80GB", "A100 80GB SXM"), ("A100 80GB", "A100 80GB SXM"),
    ("A100", "A100 40GB PCIe"), ("V100", "V100 SXM2 32GB"), ("T4", "T4"),
    ("L4", "L4"), ("A10", "A10"), ("3090", "RTX 3090"), ("4090", "RTX 4090"))


def catalog_model(nvml_name: str) -> str | None:
    """The catalog model an NVML product name (``"NVIDIA H100 80GB HBM3"``)
    names, or None."""
    name = nvml_name.upper()
    for key, model in NVML_NAMES:
        if re.search(rf"(?<![A-Z0-9]){re.escape(key)}(?![A-Z0-9])", name):
            return model
    return None


# --------------------------------------------------------------------------
# Registry

_BUILT = {"local-cpu": local_cpu_machine, "nvml": nvml_machine}

#: Name prefix -> the function that builds such a machine, registered by the
#: module that owns the prefix (``dask://`` and ``dask-local:`` by
#: :mod:`lib.platform.dask_cluster`, which imports this module).
RESOLVERS: dict[str, Callable[[str], Machine]] = {}


def list_machines() -> list[str]:
    """Names of every shipped profile."""
    files = resources.files("lib.platform").joinpath("profiles")
    shipped = sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".json"))
    return shipped + sorted(_BUILT)


#: Largest profile file read, bytes (a profile is a few KB; a FIFO or a device
#: file is refused before any read).
MAX_PROFILE_BYTES = 1 << 20


def _read_profile(path: Path) -> dict:
    """The JSON object of a profile file, or MachineError naming the file."""
    try:
        info = path.stat()
    except OSError as exc:
        raise MachineError(f"profile {path}: cannot read it ({exc.strerror})") \
            from None
    if not stat.S_ISREG(info.st_mode):
        raise MachineError(f"profile {path}: not a regular file")
    if info.st_size > MAX_PROFILE_BYTES:
        raise MachineError(f"profile {path}: {info.st_size} bytes, more than a "
                           f"profile's {MAX_PROFILE_BYTES}")
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise MachineError(f"profile {path}: not UTF-8 text") from None
    except (json.JSONDecodeError, ValueError) as exc:
        raise MachineError(f"profile {path}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise MachineError(f"profile {path}: expected a JSON object, got "
                           f"{type(obj).__name__}")
    return obj


#: Profile JSON files of one's own that :func:`load_machine` finds by the name
#: inside them (paths separated by ``os.pathsep``). ``gpuhive book`` sets it
#: for a profile given by its path, so that its notebooks, and the pages
#: they print, name the machine and not a file.
PROFILES_ENV = "GPUHIVE_PROFILES"


def own_profile(name: str) -> Machine | None:
    """The machine named ``name`` among the profiles of :data:`PROFILES_ENV`
    (the first that has it), or None; a listed file that is not a profile is
    a MachineError naming it."""
    for entry in os.environ.get(PROFILES_ENV, "").split(os.pathsep):
        if entry:
            path = Path(entry).expanduser()
            machine = machine_from_json(_read_profile(path), default_name=path.stem)
            if machine.name == name:
                return machine
    return None


def machine_name(spec: str | Path) -> str:
    """The name a machine's calibration, characterisation and history are
    kept under, for what ``--machine`` was given: the profile's own name
    where ``spec`` is the path of a profile file (``lab/box.json`` holding
    ``"name": "my-box"`` is ``my-box``, the name every run records under),
    else ``spec`` itself, unread (a Dask spec is not connected to).

    Raises:
        MachineError: ``spec`` is the path of a file that is not a profile.
    """
    text = str(spec)
    if _is_profile_path(spec) and "://" not in text \
            and not any(text.startswith(p) for p in RESOLVERS):
        return load_machine(spec).name
    return text


def _is_profile_path(name: str | Path) -> bool:
    """Whether :func:`load_machine` reads ``name`` (past its resolvers) as
    the path of a profile file: a Path, or a name with a ``/`` or ending in
    ``.json``."""
    return isinstance(name, Path) or (isinstance(name, str) and (
        "/" in name or name.endswith(".json")))


def load_machine(name: str | Path | Mapping[str, Any] | Machine) -> Machine:
    """A machine: a shipped profile's name, the path of a profile JSON of one's
    own (the format of the reference chapter; any name containing a ``/`` or
    ending in ``.json`` is a path), a profile object (that JSON, loaded), or
    a Machine, returned unchanged.

    Raises:
        MachineError: an unknown name (the message lists the known ones), or a
            file that is missing, not a profile, or malformed (naming it).
    """
    if isinstance(name, Machine):
        return name
    if isinstance(name, Mapping):
        return machine_from_json(name)
    if not isinstance(name, (str, Path)):
        raise MachineError(f"machine {name!r}: expected a profile name, the path "
                           "of a profile JSON, a profile object or a Machine")
    for prefix, resolve in RESOLVERS.items():
        if isinstance(name, str) and name.startswith(prefix):
            return resolve(name)
    if _is_profile_path(name):
        path = Path(name).expanduser()
        try:
            machine = machine_from_json(_read_profile(path),
                                        default_name=path.stem)
            if machine.name in list_machines():
                raise MachineError(
                    f"name {machine.name!r} is a shipped profile's; give yours "
                    "another (calibration and history are kept by name)")
            return machine
        except MachineError as exc:
            text = str(exc)
            raise MachineError(text if str(path) in text
                               else f"profile {path}: {text}") from None
    if name in _BUILT:
        return _BUILT[name]()
    path = resources.files("lib.platform").joinpath("profiles", f"{name}.json")
    if not path.is_file():
        own = own_profile(name)
        if own is not None:
            return own
        raise MachineError(f"unknown machine {name!r}; known: "
                           f"{', '.join(list_machines())}, or the path of a "
                           "profile JSON")
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise MachineError(f"profile {name}: not valid JSON ({exc.msg})") from None
    return machine_from_json(obj)
