"""How much one characterisation measures, per budget.

:data:`CHARACTERISATION_PLANS` holds one :class:`CharacterisationPlan` per
budget of :data:`lib.budgets.BUDGETS`: the task sizes measured on each device
alone, the sizes also run over all devices with several share patterns, and the
repeats, warm-ups and passes that make each figure a robust median.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lib.budgets import plans

Dims = Mapping[str, int]


@dataclass(frozen=True)
class CharacterisationPlan:
    """How much one characterisation measures.

    Attributes:
        sizes: kind -> task dimensions measured one device at a time, on each
            device (>= 3 per kind, spanning >= 100x in work).
        multi: kind -> dimensions also run over all devices, once per share
            pattern.
        patterns: share patterns for multi-device runs (``"equal"``, ``"ramp"``
            = 1:2:..:n, ``"reverse"`` = n:..:1).
        passes: times the whole plan is done, each pass in a fresh random
            order; a run's figure is the median over every timed repeat of
            every pass, so a burst of someone else's load that covers one pass
            does not decide it.
        repeats: timed repeats per run and pass.
        warmup: untimed runs before the timed ones (per run and pass).
        latency_runs: runs of the near-empty task per device (each ``repeats``
            timed repeats) for the hand-off latency.
        copy_bytes: size of the direct shared-memory copy, bytes.
        copy_repeats: repeats of each direct copy and ping-pong (medians).
        min_timed_s: timed seconds a run should add up to in each pass: a
            run whose ``repeats`` take less is run again (whole calls of
            ``repeats``, warm-up included), up to ``max_calls`` calls a pass.
            A sub-millisecond run's figure is otherwise the median of a few
            samples of wake-ups and hand-offs, the noisiest figure of all.
        max_calls: the most calls of one run in one pass.
    """

    sizes: Mapping[str, tuple[Dims, ...]]
    multi: Mapping[str, tuple[Dims, ...]]
    patterns: tuple[str, ...]
    passes: int
    repeats: int
    warmup: int
    latency_runs: int
    copy_bytes: int
    copy_repeats: int
    min_timed_s: float = 0.0
    max_calls: int = 1


def _sq(*ns: int) -> tuple[Dims, ...]:
    return tuple({"M": n, "N": n, "K": n} for n in ns)


def _vec(*ns: int, **extra: int) -> tuple[Dims, ...]:
    return tuple({"N": n, **extra} for n in ns)


def _grid(*ns: int, t: int) -> tuple[Dims, ...]:
    return tuple({"H": n, "W": n, "T": t} for n in ns)


#: Thin matmuls (few rows of A, a large B every shard needs) are dominated by
#: handing B over rather than by arithmetic: they separate the host link's cost
#: from the efficiencies, which the other kinds (every byte count growing with
#: the same rows) cannot. A tiny reduce and elementwise over all devices,
#: against the same tasks on one, separate what the host spends on each shard
#: (``host_s``) from the launch every shard pays in parallel.
#:
#: ``quick`` does six passes (about two minutes on two cores, was three and
#: one minute). On a core another process keeps busy a run's repeats are
#: bimodal (the shard starts at once or waits out that process's time slice)
#: and their median is noisy; the calibration's held-out error follows the
#: number of repeats. MEASURED on ``local-cpu``, 5-fold CV median APE of the
#: pooled quiet + loaded fit, three pairs of six-pass characterisations
#: (seeds 11-13), each pair against a random half of its own repeats:
#: quiet 9.9 -> 9.0 %, loaded 18.9 -> 15.7 %; six earlier pairs of three
#: passes against half of theirs: quiet 10.5 -> 10.2 %, loaded 16.4 -> 14.6 %.
CHARACTERISATION_PLANS: dict[str, CharacterisationPlan] = plans({
    "smoke": CharacterisationPlan(
        sizes={"matmul": _sq(64, 160, 400) + ({"M": 8, "N": 768, "K": 768},),
               "reduce": _vec(10**4, 10**5, 10**6),
               "elementwise": _vec(10**4, 10**5, 10**6),
               "stencil": _grid(64, 256, 640, t=2),
               "histogram": _vec(10**4, 10**5, 2 * 10**6, B=64)},
        multi={"matmul": _sq(400), "reduce": _vec(10**4, 10**6),
               "elementwise": _vec(10**4, 10**6), "stencil": _grid(640, t=2),
               "histogram": _vec(10**6, B=64)},
        patterns=("equal", "ramp"), passes=2, repeats=2, warmup=1, latency_runs=3,
        copy_bytes=8 * 2**20, copy_repeats=3, min_timed_s=0.002, max_calls=2),
    "quick": CharacterisationPlan(
        sizes={"matmul": _sq(64, 160, 400, 1000)
               + ({"M": 16, "N": 1024, "K": 1024}, {"M": 16, "N": 2048, "K": 2048}),
               "reduce": _vec(10**4, 10**5, 10**6, 10**7),
               "elementwise": _vec(10**4, 10**5, 10**6, 10**7),
               "stencil": _grid(64, 256, 1024, 2048, t=4),
               "histogram": _vec(10**4, 10**5, 10**6, 10**7, B=256)},
        multi={"matmul": _sq(400, 1000) + ({"M": 16, "N": 2048, "K": 2048},),
               "reduce": _vec(10**4, 10**6, 10**7),
               "elementwise": _vec(10**4, 10**6, 10**7),
               "stencil": _grid(1024, 2048, t=4),
               "histogram": _vec(10**6, 10**7, B=256)},
        patterns=("equal", "ramp", "reverse"), passes=6, repeats=3, warmup=1,
        latency_runs=6, copy_bytes=64 * 2**20, copy_repeats=5,
        min_timed_s=0.01, max_calls=8),
    "full": CharacterisationPlan(
        sizes={"matmul": _sq(64, 128, 256, 512, 1024, 2048)
               + ({"M": 16, "N": 1024, "K": 1024}, {"M": 16, "N": 4096, "K": 4096}),
               "reduce": _vec(10**4, 10**5, 10**6, 10**7, 4 * 10**7),
               "elementwise": _vec(10**4, 10**5, 10**6, 10**7, 4 * 10**7),
               "stencil": _grid(64, 256, 1024, 2048, 4096, t=4),
               "histogram": _vec(10**4, 10**5, 10**6, 10**7, 4 * 10**7, B=256)},
        multi={"matmul": _sq(512, 1024, 2048) + ({"M": 16, "N": 4096, "K": 4096},),
               "reduce": _vec(10**4, 10**6, 10**7, 4 * 10**7),
               "elementwise": _vec(10**4, 10**6, 10**7, 4 * 10**7),
               "stencil": _grid(1024, 2048, 4096, t=4),
               "histogram": _vec(10**6, 10**7, 4 * 10**7, B=256)},
        patterns=("equal", "ramp", "reverse"), passes=5, repeats=5, warmup=1,
        latency_runs=10, copy_bytes=256 * 2**20, copy_repeats=9,
        min_timed_s=0.02, max_calls=8),
}, "characterisation plans")


def pattern_weights(pattern: str, n: int) -> list[float]:
    """Share weights of a multi-device pattern over ``n`` devices."""
    if pattern == "equal":
        return [1.0] * n
    if pattern == "ramp":
        return [float(i + 1) for i in range(n)]
    if pattern == "reverse":
        return [float(n - i) for i in range(n)]
    raise ValueError(f"unknown share pattern {pattern!r}")
