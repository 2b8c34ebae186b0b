"""``GPUHive-Split-v0``: one split decision per step, rewarded by Eq. (2).

Each step shows the policy one task on one machine in one state (the spaces
are in :mod:`lib.policies.actions`) and takes one action. The environment turns the
action into a :class:`~lib.contract.Decision`, hashes it and passes it through
Gate 1 (:func:`lib.security.check_decision`). A decision Gate 1 refuses earns
``-penalty`` and is never executed. An accepted one runs on the backend and
earns Eq. (2)::

    r = log(T_equal / T_decision)

with ``T_equal`` the time of the equal split
(:class:`lib.policies.baselines.EqualSplit`)
of the same task in the same state. The equal-split action earns exactly 0; a
decision twice as fast earns log 2.

Two modes:

- ``task``: independent tasks. Every step *terminates* its episode
  (``terminated=True``): nothing the decision does changes the next task or
  the next device state (the tasks and the background load are drawn
  independently of the actions), so there is no future to bootstrap from and
  a value is the expected reward of one decision. The next ``reset`` draws a
  fresh task and background-load snapshot; on a curriculum it keeps the
  machine (and its background load running on) for ``machine_episodes``
  episodes before it draws another, since building a machine costs more than
  a step.
- ``stream``: tasks arrive over time and occupy the devices they run on, so
  what is busy now depends on earlier decisions (model backend only). The
  episode is a horizon of ``episode_len`` arrivals, then ``truncated`` (not
  terminated: the stream would go on; the horizon only bounds an episode).

Stream mode's occupancy model. Task k arrives at time ``t_k``; the gap to the
next arrival is exponential (Poisson arrivals, drawn from the environment's
seeded generator) with mean ``T_ref / load``, where ``T_ref`` is task k's
equal-split time on devices with no backlog -- so the offered load is about
``load`` whatever the task sizes. Each device keeps ``busy_until[i]``, when its
earlier shards finish. At ``t`` a device has backlog
``b_i = max(0, busy_until[i] - t)``; a new shard on it starts when the backlog
clears (first come, first served), so a decision takes::

    T_stream(d) = max over its devices with rows of (b_i + t_i) + t_merge

with ``t_i`` and ``t_merge`` from Eq. (1) (background load still stretches
``t_i`` by ``1 / (1 - u)``). Afterwards ``busy_until[i] = t + b_i + t_i`` for
those devices, plus ``t_merge`` when the merge runs on them (a ``sum`` over
``p2p`` or ``nccl``). ``T_equal`` is the same formula for the equal split on the
same backlog. The observation shows the backlog through each device's
utilisation, ``u_i = 1 - (1 - u_bg,i) T_ref / (T_ref + b_i)``: the fraction of
the window ``[t, t + b_i + T_ref]`` the device is not free for the new task (0
without backlog or load, toward 1 as the backlog dwarfs the task). Queued
shards do not hold memory in the model. A refused decision's task is dropped.
The arrival times, tasks and background load never depend on the actions, so
two policies run with one seed meet the same stream.

Backends (``config.backend``):

- ``model``: times from the cost model, Eq. (1) -- PREDICTED;
- ``cpu``: real worker processes on ``local-cpu`` -- MEASURED; ``T_equal`` is
  measured every step, and reused when the decision is the equal split;
- ``cuda``: CuPy on real GPUs -- MEASURED; constructing the environment raises
  :class:`~lib.execution.BackendUnavailable` where that cannot run.

Measured backends need a fixed real machine, no simulated load, ``task`` mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym
import numpy as np

from lib.contract import Decision, TaskSpec
from lib.costmodel import CostParams, Prediction, predict
from lib.env.curriculum import (
    Curriculum,
    Stage,
    fitting_equal_split,
    sample_machine,
    sample_task_and_split,
)
from lib.execution import BACKENDS, Backend, Result, get_backend
from lib.platform.machines import Machine, load_machine
from lib.platform.telemetry import SimulatedTelemetry, Snapshot, idle
from lib.policies.actions import (
    SLOTS,
    Decoder,
    action_space,
    observation_space,
    observe,
)
from lib.policies.oracle import optimum
from lib.security import check_decision

ENV_MODES = ("task", "stream")
#: Task footprints (log10 bytes) without a curriculum stage: model backend.
MODEL_LOG10_BYTES = (4.0, 10.0)
#: ... and measured backends (small tasks: a real run per step, twice).
MEASURED_LOG10_BYTES = (4.0, 7.0)
#: SimulatedTelemetry steps run at reset so an episode starts in steady state.
LOAD_BURN_IN = 10


@dataclass(frozen=True)
class EnvConfig:
    """Everything that shapes an environment (``gymnasium.make`` keywords too)."""

    mode: str = "task"
    """``"task"`` (independent tasks) or ``"stream"`` (arrivals, occupancy)."""
    backend: str = "model"
    """Where times come from: ``"model"``, ``"cpu"`` or ``"cuda"``."""
    machine: str | Machine | None = "hetero-4"
    """A fixed machine (profile name or Machine), or None to draw one per
    episode from the curriculum's current stage."""
    curriculum: Curriculum | None = None
    """Stages to draw machines, task sizes and load from (default Curriculum())."""
    stage: int | str = 0
    """The curriculum stage in use (index or name); change with ``set_stage``."""
    episode_len: int = 16
    """Stream mode: arrivals per episode (then truncated), typically 8-64."""
    machine_episodes: int = 16
    """Task mode on a curriculum: episodes (one step each) on one machine
    before the next reset draws another (1: a new machine every episode)."""
    penalty: float = 1.0
    """A decision Gate 1 refuses earns ``-penalty`` (log units; 1.0 = as bad as
    being e times slower than equal split)."""
    min_share: float = 1e-3
    """Shares below this fraction of the total are dropped (1e-3 to 1e-2)."""
    p_busy: float | None = None
    """Background load: steady-state probability a device is busy (0 idle,
    0.3-0.5 busy); None takes the stage's value, or 0 without a stage."""
    p_idle: float | None = None
    """Probability that a machine's background load is off altogether for
    its episodes; None takes the stage's value, or 0 without a stage."""
    p_unhealthy: float = 0.0
    """Probability each step that a device is marked unhealthy (one stays up)."""
    load: float = 0.8
    """Stream mode: offered load, mean arrival gap = equal-split time / load."""
    task_log10_bytes: tuple[float, float] | None = None
    """Range of log10 task footprint in bytes; None: the stage's, else
    MODEL_LOG10_BYTES or MEASURED_LOG10_BYTES."""
    tasks: tuple[TaskSpec, ...] = ()
    """Fixed tasks to cycle through instead of sampling them."""
    with_optimum: bool = False
    """Put the exhaustive optimum's PREDICTED time in ``info["T_opt"]`` (task mode;
    costs about a millisecond per step)."""
    params: CostParams | None = None
    """Cost-model parameters (default: uncalibrated)."""
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    """Passed to the backend (``repeats``, ``warmup``, ``seed``...)."""


def _validate(cfg: EnvConfig) -> None:
    if cfg.mode not in ENV_MODES:
        raise ValueError(f"mode {cfg.mode!r}: expected one of {', '.join(ENV_MODES)}")
    if cfg.backend not in BACKENDS:
        raise ValueError(f"backend {cfg.backend!r}: expected one of "
                         f"{', '.join(BACKENDS)}")
    if cfg.episode_len < 1:
        raise ValueError(f"episode_len must be >= 1, got {cfg.episode_len}")
    if cfg.machine_episodes < 1:
        raise ValueError(f"machine_episodes must be >= 1, got "
                         f"{cfg.machine_episodes}")
    if not math.isfinite(cfg.penalty):
        raise ValueError(f"penalty must be finite, got {cfg.penalty}")
    if not 0.0 <= cfg.min_share < 1.0:
        raise ValueError(f"min_share must be in [0, 1), got {cfg.min_share}")
    if not cfg.load > 0:
        raise ValueError(f"load must be positive, got {cfg.load}")
    if cfg.backend == "model":
        return
    if cfg.mode == "stream":
        raise ValueError(f"stream mode simulates device occupancy with the cost "
                         f"model; backend {cfg.backend!r} measures one task at a "
                         "time: use backend='model'")
    if cfg.machine is None:
        raise ValueError(f"backend {cfg.backend!r} measures a real machine: give "
                         "machine='local-cpu' (cpu) or 'nvml' (cuda); curriculum "
                         "machines are simulated")
    if (cfg.p_busy or 0.0) > 0 or cfg.p_unhealthy > 0:
        raise ValueError(f"simulated background load or faults cannot slow backend "
                         f"{cfg.backend!r}, which measures: set p_busy=0 and "
                         "p_unhealthy=0")


def stream_seconds(prediction: Prediction, backlog: np.ndarray) -> float:
    """``T_stream``: each device's part starts after its backlog (seconds)."""
    return float(max(backlog[d.device] + d.total for d in prediction.devices
                     if d.rows > 0) + prediction.t_merge)


class SplitEnv(gym.Env):
    """The split environment (module docstring: modes, reward, occupancy).

    Args:
        config: an :class:`EnvConfig`; keyword arguments override its fields.

    Raises:
        ValueError: an inconsistent configuration (the message says which field).
        BackendUnavailable: the backend cannot run here (``cuda`` without CUDA,
            ``cpu`` on a machine whose devices are not CPU cores).
    """

    metadata = {"render_modes": []}

    def __init__(self, config: EnvConfig | None = None, **overrides: Any):
        cfg = replace(config or EnvConfig(), **overrides)
        _validate(cfg)
        self.config = cfg
        self.observation_space = observation_space()
        self.action_space = action_space()
        self.curriculum = cfg.curriculum or Curriculum()
        self.stage: Stage | None = None
        if cfg.machine is None or cfg.curriculum is not None:
            self.stage = self.curriculum.stage(cfg.stage)
        self.machine: Machine | None = None
        self.backend: Backend | None = None
        self._fixed: Machine | None = None
        if cfg.machine is not None:
            self.machine = self._fixed = load_machine(cfg.machine)
            self.backend = self._make_backend(self.machine)
        self.task: TaskSpec | None = None
        self.telemetry: Snapshot | None = None
        self.equal: Decision | None = None
        self.now = 0.0
        self.busy_until = np.zeros(0)
        self._sim: SimulatedTelemetry | None = None
        self._equal_pred: Prediction | None = None
        self._obs: dict[str, np.ndarray] = {}
        self._steps = 0
        self._task_index = 0
        self._episodes = 0
        #: The machine the background load was started for (None: none yet).
        self._sim_of: Machine | None = None
        self.decoder: Decoder | None = None

    # -- configuration -------------------------------------------------------

    def _make_backend(self, machine: Machine) -> Backend:
        options = dict(self.config.backend_options)
        if self.config.backend == "model":
            options.setdefault("params", self.config.params)
        return get_backend(self.config.backend, machine, **options)

    @property
    def measured(self) -> bool:
        """Whether rewards come from measurements (cpu, cuda backends)."""
        return self.config.backend != "model"

    @property
    def label(self) -> str:
        """``"PREDICTED (model)"`` or ``"MEASURED (cpu)"``: what a time here is."""
        return f"{'MEASURED' if self.measured else 'PREDICTED'} ({self.config.backend})"

    def set_stage(self, stage: int | str | Stage) -> None:
        """Use ``stage`` of the curriculum from the next reset on."""
        self.stage = self.curriculum.stage(stage)

    def _task_range(self) -> tuple[float, float]:
        if self.config.task_log10_bytes is not None:
            return self.config.task_log10_bytes
        if self.stage is not None:
            return self.stage.log10_bytes
        return MEASURED_LOG10_BYTES if self.measured else MODEL_LOG10_BYTES

    def _p_busy(self) -> float:
        if self.config.p_busy is not None:
            return self.config.p_busy
        return self.stage.p_busy if self.stage is not None else 0.0

    # -- episode -------------------------------------------------------------

    def reset(self, *, seed: int | None = None,
              options: Mapping[str, Any] | None = None
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode.

        Options: ``"machine"`` (a profile name or Machine for this episode),
        ``"stage"`` (curriculum stage, kept for later episodes), ``"task"`` (the
        first task). A seed, an option, stream mode or ``machine_episodes``
        task-mode episodes on the current machine draw the machine (and its
        background load) afresh; otherwise the next task comes on the same
        machine, its load running on.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        if "stage" in options:
            self.set_stage(options["stage"])
        fresh = (seed is not None or "machine" in options or "stage" in options
                 or self.machine is None or self._sim_of is not self.machine
                 or self.config.mode == "stream"
                 or self._episodes >= self.config.machine_episodes)
        if fresh:
            self._new_machine(options)
        self._episodes += 1
        self._steps = 0
        self.now = 0.0
        self.busy_until = np.zeros(self.machine.n)
        self._next_state(options.get("task"))
        info = {"task": self.task, "machine": self.machine.name,
                "stage": self.stage.name if self.stage else None,
                "label": self.label,
                "T_equal": self._t_equal() if not self.measured else None}
        return self._observation(), info

    def _new_machine(self, options: Mapping[str, Any]) -> None:
        """Draw (or load) the episode's machine and start its background load."""
        if "machine" in options:
            machine = load_machine(options["machine"])
        elif self._fixed is None:
            machine = self.curriculum_machine()
        else:
            machine = self._fixed
        if machine.n > SLOTS:
            raise ValueError(f"machine {machine.name} has {machine.n} devices; the "
                             f"environment has {SLOTS} device slots")
        if self.backend is None or getattr(self.backend, "machine", None) \
                is not machine:
            if self.backend is not None:
                self.backend.close()
            self.backend = self._make_backend(machine)
        self.machine = machine
        p_busy = self._p_busy()
        p_idle = self.config.p_idle if self.config.p_idle is not None \
            else self.stage.p_idle if self.stage is not None \
            and self.config.p_busy is None else 0.0
        if p_busy > 0 and p_idle > 0 and self.np_random.random() < p_idle:
            p_busy = 0.0
        self._sim = None
        if p_busy > 0:
            self._sim = SimulatedTelemetry(
                machine, seed=int(self.np_random.integers(2**31)), p_busy=p_busy,
                **self._load_options())
            for _ in range(LOAD_BURN_IN):
                self._sim.step()
        self._episodes = 0
        self._task_index = 0
        self._sim_of = machine

    def _load_options(self) -> dict[str, Any]:
        """Keyword arguments of the background load (none by default)."""
        return {}

    def curriculum_machine(self) -> Machine:
        """A machine of the current stage, from the environment's generator."""
        return sample_machine(self.np_random, self.stage or self.curriculum.stage(0))

    def _next_state(self, task: TaskSpec | None = None) -> None:
        """Draw the next step's telemetry and task; compute the observation."""
        machine = self.machine
        snap = self._sim.step() if self._sim is not None else idle(machine)
        if self.config.p_unhealthy > 0:
            up = self.np_random.random(machine.n) >= self.config.p_unhealthy
            if not up.any():
                up[int(self.np_random.integers(machine.n))] = True
            snap = replace(snap, healthy=tuple(bool(u) for u in up))
        if task is None and self.config.tasks:
            task = self.config.tasks[self._task_index % len(self.config.tasks)]
        if task is None:
            task, equal = sample_task_and_split(self.np_random, machine, snap,
                                                self._task_range())
        else:
            equal = fitting_equal_split(task, machine, snap)
            if equal is None:
                raise ValueError(f"task {task.describe()}: its equal split does "
                                 f"not fit on {machine.name} (Gate 1 refuses it), "
                                 "so Eq. (2) has no reference time")
        self._task_index += 1
        self.task, self.telemetry, self.equal = task, snap, equal
        self._equal_pred = None
        seen = snap
        if not self.measured:
            self._equal_pred = predict(task, self.equal, machine, snap,
                                       self.config.params)
            if self.config.mode == "stream":
                t_ref = self._equal_pred.total
                util = 1.0 - (1.0 - np.asarray(snap.utilisation)) * t_ref / (
                    t_ref + self.backlog)
                seen = replace(snap, utilisation=tuple(util.tolist()))
        self.decoder = Decoder(machine, snap, self.config.min_share)
        self._obs = observe(task, machine, snap, seen, self.decoder)

    @property
    def backlog(self) -> np.ndarray:
        """Seconds of earlier work each device still has queued (stream mode)."""
        return np.maximum(0.0, self.busy_until - self.now)

    def _observation(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self._obs.items()}

    def _t_equal(self) -> float:
        """Eq. (2)'s reference time from the model (stream: on the backlog)."""
        if self.config.mode == "stream":
            return stream_seconds(self._equal_pred, self.backlog)
        return self._equal_pred.total

    # -- stepping ------------------------------------------------------------

    def step(self, action: Mapping[str, Any]):
        """Decide the current task with ``action`` (see :mod:`lib.policies.actions`)."""
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        shares = np.asarray(action["shares"], dtype=np.float64).reshape(-1)
        decision = self.decoder.decide(
            self.task, shares, int(action["block"]), int(action["mode"]),
            int(action["comm_path"]), int(action["chunks"]))
        return self.step_decision(decision)

    def step_decision(self, decision: Any):
        """Decide the current task with ``decision`` itself (a baseline's, the
        optimum's, or anything: Gate 1 judges it like an action's)."""
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        reward, info = self._evaluate(decision)
        self._steps += 1
        if self.config.mode == "task":
            # the episode ends here; its last observation is the one decided
            return self._observation(), reward, True, False, info
        t_ref = self._equal_pred.total
        self.now += float(self.np_random.exponential()) * t_ref / self.config.load
        self._next_state()
        truncated = self._steps >= self.config.episode_len
        return self._observation(), reward, False, truncated, info

    def _run(self, decision: Decision) -> Result:
        """The only place a decision reaches the backend."""
        if not self.measured:
            self.backend.telemetry = self.telemetry
        return self.backend.run(self.task, decision)

    def _evaluate(self, decision: Any) -> tuple[float, dict[str, Any]]:
        """Gate 1, then (only if accepted) run and score the decision."""
        task, machine = self.task, self.machine
        verdict = check_decision(decision, task, machine, self.telemetry)
        stream = self.config.mode == "stream"
        info: dict[str, Any] = {
            "task": task, "machine": machine.name,
            "stage": self.stage.name if self.stage else None,
            "decision": decision, "accepted": verdict.accepted,
            "gate1": verdict.summary(), "gate1_checks": verdict.checks,
            "label": self.label, "T_decision": None,
            "T_equal": None if self.measured else self._t_equal(), "T_opt": None,
        }
        if stream:
            info["now"] = self.now
            info["backlog"] = tuple(self.backlog.tolist())
        if self.config.with_optimum and not stream:
            info["T_opt"] = optimum(task, machine, self.telemetry,
                                    self.config.params).total
        if not verdict.accepted:
            return -self.config.penalty, info
        if not isinstance(decision, Decision):   # JSON Gate 1 accepted
            decision = Decision.from_json(decision)
            info["decision"] = decision
        result = self._run(decision)
        if self.measured:
            t_dec = result.metrics.total_seconds
            t_eq = t_dec if decision == self.equal \
                else self._run(self.equal).metrics.total_seconds
        elif stream:
            pred = result.detail["prediction"]
            t_dec = stream_seconds(pred, self.backlog)
            t_eq = info["T_equal"]
            self._occupy(decision, pred)
        else:
            t_dec = result.metrics.total_seconds
            t_eq = info["T_equal"]
        info["T_decision"], info["T_equal"] = t_dec, t_eq
        return math.log(t_eq / t_dec), info

    def _occupy(self, decision: Decision, pred: Prediction) -> None:
        """Stream mode: the decision's devices are busy until their part ends."""
        active = [d for d in pred.devices if d.rows > 0]
        on_devices = self.task.merge == "sum" and len(active) > 1 \
            and decision.comm_path in ("p2p", "nccl")
        start = np.maximum(self.busy_until, self.now)
        for d in active:
            self.busy_until[d.device] = start[d.device] + d.total + (
                pred.t_merge if on_devices else 0.0)

    def close(self) -> None:
        """Release the backend (the cpu backend's worker processes)."""
        if self.backend is not None:
            self.backend.close()
