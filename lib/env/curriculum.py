"""The training curriculum: which machines, tasks and loads a policy meets, in order.

One policy is trained for every machine, so the curriculum covers the catalog:
1 to 16 devices, identical sets, induced clock-locked cards, NVSwitch boxes,
PCIe-only boxes, mixed generations, the shipped profiles and CPU cores, idle
and busy (one or several devices loaded). Stages go from easy to hard
(:data:`DEFAULT_STAGES`):

1. ``identical`` -- 1-8 identical cards, large tasks, idle devices;
2. ``mixed`` -- 2-8 cards of mixed generations, tasks from tiny to large (where
   launch and transfer latencies make using fewer devices right), idle;
3. ``shipped`` -- the shipped profiles (``hetero-4``, ``uni-server-1gpu``,
   ``uni-server-2gpu-induced``) and 1-8 CPU cores like ``local-cpu``, with
   background load on a fifth of the devices;
4. ``busy`` -- every kind of machine of 1-8 devices with seeded background
   load (:class:`lib.platform.telemetry.SimulatedTelemetry`) on 40 % of them;
5. ``catalog`` -- every kind of machine of 1-16 devices, idle or loaded.

Machine kinds (:data:`MACHINE_KINDS`): ``identical`` (one model, a topology it
can have), ``induced`` (identical cards, some clock-locked to 40-90 %, like
``uni-server-2gpu-induced``), ``mixed`` (models drawn independently),
``shipped``, ``cpu`` (CPU cores as devices), ``catalog`` (a draw among those
five) and ``held-out``. Device counts are drawn log-uniformly over a stage's
range, so small machines are common and 12-16 devices still appear.

Topologies (:data:`TOPOLOGIES`): ``host-only`` (every copy through the host),
``pcie-p2p`` (a PCIe-only box: every pair peer-to-peer over PCIe),
``nvlink-pairs`` (devices 0-1, 2-3, ... bridged; NVLink where both cards have
it, else PCIe peer-to-peer), ``nvswitch`` (every pair of NVLink cards at NVLink
rate), ``random`` (each pair linked with probability 1/2); and, held out,
``nvlink-ring`` (device i to i+1 over NVLink) and ``islands`` (two NVSwitch
halves joined through the host). NCCL is present with probability 3/4.

Held out for the transfer test (T7): the card models of :data:`HELD_OUT_MODELS`
and the topologies of :data:`HELD_OUT_TOPOLOGIES`. No training stage ever builds
a machine with either, so every machine of :func:`held_out_machines` (each holds
at least one held-out model, and the first has 12 or more devices) is one a
policy has never been trained on.

Tasks (:func:`sample_task`) are the five kinds with a footprint drawn
log-uniformly in a stage's range of bytes (10 KB to 10 GB by default: six orders
of magnitude of memory, more of work), shrunk until the equal split fits in
every usable device's free memory (Gate 1's memory check).

Everything draws from the generator it is given, so a seed fixes it all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lib.contract import DIM_LIMITS, KINDS, MAX_DIM, Decision, TaskSpec
from lib.platform.machines import (
    GPU_CATALOG,
    LINK_KINDS,
    Machine,
    load_machine,
    local_cpu_machine,
    machine_from_json,
)
from lib.platform.telemetry import Snapshot
from lib.policies.baselines import EqualSplit
from lib.security.gate1 import check_decision

#: Catalog models no training stage uses (transfer is tested on them).
HELD_OUT_MODELS: tuple[str, ...] = ("H200 SXM", "L4", "RTX 3090")
#: Catalog models the training stages draw from.
TRAINING_MODELS: tuple[str, ...] = tuple(m for m in GPU_CATALOG
                                         if m not in HELD_OUT_MODELS)
#: Topologies the training stages draw from.
TRAINING_TOPOLOGIES = ("host-only", "pcie-p2p", "nvlink-pairs", "nvswitch",
                       "random")
#: Topologies only held-out machines have.
HELD_OUT_TOPOLOGIES = ("nvlink-ring", "islands")
TOPOLOGIES = TRAINING_TOPOLOGIES + HELD_OUT_TOPOLOGIES
MACHINE_KINDS = ("identical", "induced", "mixed", "shipped", "cpu", "catalog",
                 "held-out")
#: How a ``catalog`` draw picks the kind of machine.
CATALOG_MIX: dict[str, float] = {"identical": 0.2, "induced": 0.1, "mixed": 0.4,
                                 "shipped": 0.15, "cpu": 0.15}
#: Shipped GPU profiles a ``shipped`` draw loads (the rest are CPU cores).
SHIPPED_PROFILES = ("hetero-4", "uni-server-1gpu", "uni-server-2gpu-induced")
#: Fraction of ``shipped`` draws that are CPU cores (``local-cpu``-like).
P_SHIPPED_CPU = 0.4
#: Most CPU cores a ``cpu`` machine has (``local-cpu`` takes at most 8).
MAX_CPU_CORES = 8
#: dtypes of sampled tasks and how often each appears.
TASK_DTYPES = ("fp32", "fp16", "bf16", "fp64")
TASK_DTYPE_P = (0.55, 0.2, 0.15, 0.1)
P_NCCL = 0.75
#: Devices of the first held-out machine (the transfer test's large one).
HELD_OUT_LARGE = (12, 16)
#: Times a task is halved before sampling gives up on fitting it.
SHRINK_TRIES = 40


@dataclass(frozen=True)
class Stage:
    """One stage of the curriculum.

    Attributes:
        name: short name (``"busy"``).
        machines: how machines are drawn: one of :data:`MACHINE_KINDS`.
        devices: inclusive range of the number of devices (1 to 64).
        log10_bytes: range of log10 of a task's footprint in bytes (4 to 10).
        p_busy: steady-state probability that a device carries background load
            (0 idle; 0.3-0.5 busy).
        steps: environment steps the stage lasts in a training schedule.
        p_idle: probability that a machine's background load is off
            altogether (idle states stay common on large machines).
    """

    name: str
    machines: str
    devices: tuple[int, int] = (2, 4)
    log10_bytes: tuple[float, float] = (4.0, 10.0)
    p_busy: float = 0.0
    steps: int = 100_000
    p_idle: float = 0.0


DEFAULT_STAGES: tuple[Stage, ...] = (
    Stage("identical", "identical", (1, 8), (8.5, 10.0), 0.0, 50_000),
    Stage("mixed", "mixed", (2, 8), (4.0, 10.0), 0.0, 100_000),
    Stage("shipped", "shipped", (1, 8), (4.0, 10.0), 0.2, 100_000, p_idle=0.4),
    Stage("busy", "catalog", (1, 8), (4.0, 10.0), 0.4, 100_000, p_idle=0.2),
    Stage("catalog", "catalog", (1, 16), (4.0, 10.0), 0.3, 200_000, p_idle=0.4),
)
#: Where evaluation machines come from; never a training stage.
HELD_OUT_STAGE = Stage("held-out", "held-out", (2, 16), (4.0, 10.0), 0.3, 0,
                       p_idle=0.4)


@dataclass(frozen=True)
class Curriculum:
    """Training stages in order, plus the held-out stage for evaluation.

    Attributes:
        stages: the training stages, easiest first.
        held_out: the stage evaluation machines come from.
        seed: fixes :meth:`held_out_machines` and :meth:`machines`; an
            environment draws from its own seeded generator instead.
    """

    stages: tuple[Stage, ...] = DEFAULT_STAGES
    held_out: Stage = HELD_OUT_STAGE
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a curriculum needs at least one stage")
        for s in self.stages:
            if s.machines == "held-out":
                raise ValueError(f"stage {s.name!r} draws held-out machines; "
                                 "a training stage must not")

    def stage(self, key: int | str | Stage) -> Stage:
        """A training stage by index or name (a Stage is returned unchanged)."""
        if isinstance(key, Stage):
            return key
        if isinstance(key, str):
            for s in (*self.stages, self.held_out):
                if s.name == key:
                    return s
            names = ", ".join(s.name for s in self.stages)
            raise ValueError(f"unknown stage {key!r}; stages: {names}, "
                             f"{self.held_out.name}")
        if not 0 <= key < len(self.stages):
            raise ValueError(f"stage index {key} out of range: the curriculum has "
                             f"{len(self.stages)} stages")
        return self.stages[key]

    def stage_at(self, step: int) -> Stage:
        """The stage a training run is in after ``step`` environment steps (the
        last stage once every budget is spent)."""
        for s in self.stages:
            if step < s.steps:
                return s
            step -= s.steps
        return self.stages[-1]

    @property
    def total_steps(self) -> int:
        """Steps of the whole schedule."""
        return sum(s.steps for s in self.stages)

    def machines(self, stage: int | str | Stage, count: int) -> list[Machine]:
        """``count`` machines of a stage from the curriculum's own seed."""
        chosen = self.stage(stage)
        names = [s.name for s in (*self.stages, self.held_out)]
        rng = np.random.default_rng((self.seed, names.index(chosen.name)
                                     if chosen.name in names else len(names)))
        return [sample_machine(rng, chosen) for _ in range(count)]

    def held_out_machines(self, count: int = 8) -> list[Machine]:
        """The evaluation machines (see :func:`held_out_machines`)."""
        return held_out_machines(self.seed, count, self.held_out)


# --------------------------------------------------------------------------
# Machines

def _peer(models: Sequence[str], a: int, b: int, nvlink: bool) -> dict:
    """A peer link between a and b: NVLink where asked and both cards have it,
    else PCIe peer-to-peer at the slower card's host link rate."""
    nv_a, nv_b = GPU_CATALOG[models[a]][7], GPU_CATALOG[models[b]][7]
    if nvlink and nv_a > 0 and nv_b > 0:
        return {"a": a, "b": b, "kind": "nvlink", "bandwidth": min(nv_a, nv_b),
                "p2p": True, "note": "curriculum: NVLink at the slower card's rate"}
    kinds = sorted((GPU_CATALOG[models[a]][6], GPU_CATALOG[models[b]][6]),
                   key=lambda k: LINK_KINDS[k][0])
    return {"a": a, "b": b, "kind": kinds[0], "p2p": True,
            "note": "curriculum: PCIe peer-to-peer behind one switch"}


def topology_peers(rng: np.random.Generator, models: Sequence[str],
                   topology: str) -> list[dict]:
    """The peer links (profile JSON) of ``topology`` over ``models``."""
    k = len(models)
    pairs = [(a, b) for a in range(k) for b in range(a + 1, k)]
    if topology == "host-only":
        return []
    if topology == "pcie-p2p":
        return [_peer(models, a, b, nvlink=False) for a, b in pairs]
    if topology == "nvlink-pairs":
        return [_peer(models, a, a + 1, nvlink=True) for a in range(0, k - 1, 2)]
    if topology == "nvswitch":
        return [_peer(models, a, b, nvlink=True) for a, b in pairs
                if GPU_CATALOG[models[a]][7] > 0 and GPU_CATALOG[models[b]][7] > 0]
    if topology == "random":
        linked = rng.random(len(pairs)) < 0.5
        return [_peer(models, a, b, nvlink=True)
                for (a, b), keep in zip(pairs, linked, strict=True) if keep]
    if topology == "nvlink-ring":
        return [_peer(models, a, a + 1, nvlink=True) for a in range(k - 1)]
    if topology == "islands":
        half = (k + 1) // 2
        return [_peer(models, a, b, nvlink=True) for a, b in pairs
                if (a < half) == (b < half)]
    raise ValueError(f"unknown topology {topology!r}; expected one of "
                     f"{', '.join(TOPOLOGIES)}")


def random_machine(rng: np.random.Generator, models: Sequence[str], name: str,
                   topology: str | None = None,
                   scales: Sequence[float] | None = None,
                   topologies: Sequence[str] = TRAINING_TOPOLOGIES) -> Machine:
    """A simulated machine of ``models`` (one device each).

    Args:
        topology: one of :data:`TOPOLOGIES`; None draws one of ``topologies``.
        scales: per device, an induced slow-down (clock lock) of its
            arithmetic and memory throughput (1.0: none).
    """
    k = len(models)
    if topology is None:
        topology = topologies[int(rng.integers(len(topologies)))]
    peers = topology_peers(rng, models, topology)
    induced = scales is not None and any(s != 1.0 for s in scales)
    devices = [{"catalog": m} for m in models]
    if scales is not None:
        for d, sc in zip(devices, scales, strict=True):
            if sc != 1.0:
                d["scale"] = float(sc)
                d["note"] = f"induced: clock-locked to {sc:.0%} (curriculum)"
    return machine_from_json({
        "name": f"{name}-{k}gpu-{topology}",
        "description": f"Simulated curriculum machine: {', '.join(models)}; "
                       f"topology {topology}"
                       f"{'; induced heterogeneity' if induced else ''}.",
        "simulated": True, "induced": induced,
        "nccl": bool(rng.random() < P_NCCL) and k > 1,
        "host_mem_bw": 100e9, "devices": devices, "peers": peers,
    })


def _count(rng: np.random.Generator, lo: int, hi: int) -> int:
    """A device count log-uniform over ``[lo, hi]`` (small machines common)."""
    x = math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))
    return int(min(hi, max(lo, math.floor(x))))


def sample_machine(rng: np.random.Generator, stage: Stage) -> Machine:
    """A machine for ``stage`` (rules in the module docstring).

    Training stages use :data:`TRAINING_MODELS` and
    :data:`TRAINING_TOPOLOGIES` only; the ``held-out`` stage puts at least one
    of :data:`HELD_OUT_MODELS` in every machine.
    """
    lo, hi = stage.devices
    if not 1 <= lo <= hi <= 64:
        raise ValueError(f"stage {stage.name!r}: device range {stage.devices} must "
                         "lie in [1, 64]")
    kind = stage.machines
    if kind not in MACHINE_KINDS:
        raise ValueError(f"stage {stage.name!r}: unknown machine kind {kind!r}; "
                         f"expected one of {', '.join(MACHINE_KINDS)}")
    if kind == "catalog":
        names = list(CATALOG_MIX)
        p = np.array([CATALOG_MIX[n] for n in names])
        kind = names[int(rng.choice(len(names), p=p / p.sum()))]
    if kind == "held-out":
        return _held_out_machine(rng, _count(rng, lo, hi), stage.name)
    pool = list(TRAINING_MODELS)
    if kind == "shipped":
        if rng.random() < P_SHIPPED_CPU:
            kind = "cpu"
        else:
            return load_machine(SHIPPED_PROFILES[int(rng.integers(
                len(SHIPPED_PROFILES)))])
    if kind == "cpu":
        return local_cpu_machine(_count(rng, 1, min(hi, MAX_CPU_CORES)))
    if kind == "identical":
        k = _count(rng, lo, hi)
        model = pool[int(rng.integers(len(pool)))]
        topology = ("nvswitch", "pcie-p2p", "host-only")[int(rng.integers(3))]
        return random_machine(rng, [model] * k, stage.name, topology)
    if kind == "induced":
        k = _count(rng, max(lo, 2), max(hi, 2)) if hi >= 2 else 1
        model = pool[int(rng.integers(len(pool)))]
        scales = [1.0] * k
        for i in rng.choice(k, size=int(rng.integers(1, max(2, k))), replace=False):
            scales[int(i)] = float(rng.uniform(0.4, 0.9))
        return random_machine(rng, [model] * k, stage.name, scales=scales)
    k = _count(rng, lo, hi)
    models = [pool[i] for i in rng.integers(len(pool), size=k)]
    return random_machine(rng, models, stage.name)


def _held_out_machine(rng: np.random.Generator, k: int, name: str) -> Machine:
    """A machine with at least one held-out model and any topology (held-out
    topologies included)."""
    everything = list(GPU_CATALOG)
    models = [everything[i] for i in rng.integers(len(everything), size=k)]
    held = HELD_OUT_MODELS[int(rng.integers(len(HELD_OUT_MODELS)))]
    for i in rng.choice(k, size=max(1, k // 4), replace=False):
        models[int(i)] = held
    return random_machine(rng, models, name, topologies=TOPOLOGIES)


def held_out_machines(seed: int = 0, count: int = 8,
                      stage: Stage = HELD_OUT_STAGE) -> list[Machine]:
    """``count`` machines no training stage can produce (each has a held-out
    model), the same for the same seed; the first has
    :data:`HELD_OUT_LARGE` devices (12 to 16) and a held-out topology."""
    rng = np.random.default_rng((seed, 0x4E1D))
    out = []
    for i in range(count):
        if i == 0:
            k = int(rng.integers(HELD_OUT_LARGE[0], HELD_OUT_LARGE[1] + 1))
            everything = list(GPU_CATALOG)
            models = [everything[j] for j in rng.integers(len(everything), size=k)]
            for j in rng.choice(k, size=k // 3, replace=False):
                models[int(j)] = HELD_OUT_MODELS[int(rng.integers(
                    len(HELD_OUT_MODELS)))]
            topology = HELD_OUT_TOPOLOGIES[int(rng.integers(
                len(HELD_OUT_TOPOLOGIES)))]
            out.append(random_machine(rng, models, stage.name, topology))
        else:
            out.append(sample_machine(rng, stage))
    return out


# --------------------------------------------------------------------------
# Tasks

def _clip_dim(value: float, kind: str, name: str) -> int:
    low, high = DIM_LIMITS.get((kind, name), (1, MAX_DIM))
    return int(min(high, max(low, round(value))))


def task_of_footprint(rng: np.random.Generator, kind: str, dtype: str,
                      footprint: float) -> TaskSpec:
    """A ``kind`` task whose whole footprint is about ``footprint`` bytes."""
    e = {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}[dtype]
    if kind == "matmul":
        side = math.sqrt(footprint / (3 * e))
        m, n, k = (side * 2.0 ** rng.uniform(-1, 1) for _ in range(3))
        dims = {"M": _clip_dim(m, kind, "M"), "N": _clip_dim(n, kind, "N"),
                "K": _clip_dim(k, kind, "K")}
    elif kind == "stencil":
        t = int(rng.integers(1, 17))
        cells = footprint / (2 * e)
        h = math.sqrt(cells) * 2.0 ** rng.uniform(-1, 1)
        dims = {"H": _clip_dim(h, kind, "H"), "W": _clip_dim(cells / h, kind, "W"),
                "T": t}
    elif kind == "elementwise":
        dims = {"N": _clip_dim(footprint / (3 * e), kind, "N")}
    elif kind == "reduce":
        dims = {"N": _clip_dim(footprint / e, kind, "N")}
    else:
        dims = {"N": _clip_dim(footprint / e, kind, "N"),
                "B": int(2 ** rng.integers(4, 13))}
    return TaskSpec(kind, dims, dtype)


def fitting_equal_split(task: TaskSpec, machine: Machine,
                        telemetry: Snapshot | None) -> Decision | None:
    """The hashed equal split of ``task`` if Gate 1 accepts it (memory above
    all), else None."""
    decision = EqualSplit().decide(task, machine, telemetry).with_hash(task)
    return decision if check_decision(decision, task, machine,
                                      telemetry).accepted else None


def sample_task(rng: np.random.Generator, machine: Machine,
                telemetry: Snapshot | None = None,
                log10_bytes: tuple[float, float] = (4.0, 10.0),
                kinds: Sequence[str] = KINDS) -> TaskSpec:
    """A random task whose equal split fits on ``machine`` as it is now.

    Kind uniform over ``kinds``; dtype from :data:`TASK_DTYPES`; footprint
    log-uniform in ``10**log10_bytes`` bytes, halved until the equal split fits.

    Raises:
        ValueError: even a tiny task does not fit (no usable memory).
    """
    return sample_task_and_split(rng, machine, telemetry, log10_bytes, kinds)[0]


def sample_task_and_split(rng: np.random.Generator, machine: Machine,
                          telemetry: Snapshot | None = None,
                          log10_bytes: tuple[float, float] = (4.0, 10.0),
                          kinds: Sequence[str] = KINDS
                          ) -> tuple[TaskSpec, Decision]:
    """:func:`sample_task` and the task's hashed equal split (Gate 1 accepted)."""
    kind = kinds[int(rng.integers(len(kinds)))]
    pick = int(np.searchsorted(np.cumsum(TASK_DTYPE_P), rng.random(), side="right"))
    dtype = TASK_DTYPES[min(pick, len(TASK_DTYPES) - 1)]
    footprint = 10.0 ** rng.uniform(*log10_bytes)
    for _ in range(SHRINK_TRIES):
        task = task_of_footprint(rng, kind, dtype, footprint)
        equal = fitting_equal_split(task, machine, telemetry)
        if equal is not None:
            return task, equal
        footprint /= 2.0
    raise ValueError(f"no {kind} task fits on {machine.name}: even "
                     f"{footprint:.3g} bytes exceeds the free memory")
