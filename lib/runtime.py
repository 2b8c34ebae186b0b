"""The runtime: one object that wires the planes together.

>>> from lib.runtime import Agent
>>> from lib.contract import TaskSpec
>>> agent = Agent(machine="hetero-4")                    # model backend
>>> task = TaskSpec("matmul", {"M": 4096, "N": 4096, "K": 4096})
>>> decision = agent.optimize(task)                      # policy, hash, Gate 1
>>> result = agent.execute(task, decision)               # Gate 1 again, run
>>> result.metrics.label
'PREDICTED (model)'

``optimize`` and ``execute`` are separate so a decision can be inspected,
logged, diffed, hand-written or loaded from JSON in between. ``execute`` checks
every decision with Gate 1 whatever its origin, and never runs a rejected one.

On the ``cpu`` and ``cuda`` backends the agent reads its devices' state
itself (``telemetry="auto"``, the default): a snapshot of what each device has
free now (:func:`live_snapshot`: on CPU cores the share of the core other
processes leave, on GPUs what their compute processes leave, MEASURED, our
own workers not counted), read again before a decision once the last is
:data:`LIVE_MAX_AGE_S` old. The policy decides under it, Gate 1
checks against it, and the run it starts teaches the history at the capacity
it really had; without it a busy core is decided for as a free one, and its
slow runs would teach the history that the core is slow. A Dask worker's
heartbeat counts the shards we ran on it as its load, so on the ``dask``
backend ``"auto"`` reads nothing (``"live"`` reads the scheduler's view).

A device the backend cannot run on (a GPU that ``CUDA_VISIBLE_DEVICES`` hides
from the ``cuda`` backend) is unhealthy in what the policy and Gate 1 see, so
the policy decides over the others and Gate 1 refuses a decision naming it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from lib.contract import MEASURING_BACKENDS, Decision, TaskSpec
from lib.costmodel.contention import (
    calibrated_bursts,
    contention_level,
    effective_snapshot,
)
from lib.costmodel.history import History, HistoryError, record_run
from lib.costmodel.overhead import level_of, overhead_snapshot
from lib.costmodel.parameters import params_for
from lib.costmodel.speed import equal_shard_seconds, speed_snapshot
from lib.execution import Backend, BackendUnavailable, Result, get_backend
from lib.platform.dask_cluster import dask_snapshot
from lib.platform.machines import Machine, load_machine
from lib.platform.telemetry import (
    Snapshot,
    TelemetryError,
    idle,
    local_cpu_snapshot,
    nvml_snapshot,
)
from lib.policies.baselines import Policy
from lib.policies.registry import default_policy, make_policy
from lib.security import Verdict, check_decision

#: ``Agent(telemetry=...)``: read the devices now, and fail if they cannot be.
LIVE = "live"
#: ``Agent(telemetry=...)``, the default: read them live where the decision runs
#: on a backend whose telemetry leaves our own work out, else decide without.
AUTO = "auto"
#: The backends ``"auto"`` reads live: their telemetry tells other processes'
#: load from ours (a Dask worker's heartbeat does not).
AUTO_LIVE_BACKENDS = ("cpu", "cuda")
#: A live snapshot this young (seconds) serves the next decision too; reading
#: one watches the cores for a tenth of a second.
LIVE_MAX_AGE_S = 2.0


def live_snapshot(machine: Machine, backend: str, *, interval: float = 0.1,
                  samples: int = 5) -> Snapshot:
    """What ``machine``'s devices look like now, read the way the measuring
    ``backend`` that runs on them sees them (MEASURED).

    ``cpu``: each core's capacity from the runnable threads of other processes
    (:func:`~lib.platform.telemetry.local_cpu_snapshot`, ``samples`` looks
    over ``interval`` seconds); ``dask``: the scheduler's view of the workers
    (:func:`~lib.platform.dask_cluster.dask_snapshot`); ``cuda``: NVML
    (:func:`~lib.platform.telemetry.nvml_snapshot`).

    Raises:
        TelemetryError: the devices cannot be read here (no ``/proc``, no
            NVIDIA driver), or the snapshot has another number of devices than
            the machine.
    """
    if backend == "cpu":
        snap = local_cpu_snapshot(machine, interval=interval, samples=samples)
    elif backend == "dask":
        snap = dask_snapshot(machine)
    elif backend == "cuda":
        snap = nvml_snapshot()
    else:
        raise TelemetryError(f"backend {backend!r} has no devices to read live "
                             f"(live telemetry reads those of "
                             f"{', '.join(MEASURING_BACKENDS)})")
    if len(snap.healthy) != machine.n:
        raise TelemetryError(f"{snap.source} telemetry reports "
                             f"{len(snap.healthy)} device(s); machine "
                             f"{machine.name} has {machine.n}")
    return snap


class DecisionRejected(ValueError):
    """Gate 1 refused a decision; ``verdict`` lists every violated check."""

    def __init__(self, verdict: Verdict):
        self.verdict = verdict
        super().__init__(verdict.summary())


class Agent:
    """Decide and execute tasks on one machine.

    Args:
        policy: anything with ``decide(task, machine, telemetry) -> Decision``,
            a policy's name as the command line takes it (``"heft"``,
            ``"oracle"``...: :data:`lib.policies.registry.POLICIES`), or the
            path of a policy file (``str`` or ``Path``); default the shipped
            learned policy, one for every machine, or proportional-to-peak
            where no policy file ships.
        machine: a profile name or a :class:`~lib.platform.machines.Machine`.
        backend: ``"model"``, ``"cpu"``, ``"cuda"`` or ``"dask"``, or a
            backend object.
        telemetry: the devices' state, handed to Gate 1 and, with each
            device's capacity made effective for the task from the history
            (:meth:`seen_by_policy`), to the policy: a
            :class:`~lib.platform.telemetry.Snapshot`; ``None`` (decide as if
            every device were idle); ``"live"`` (read the devices before each
            decision, :func:`live_snapshot`, on the measuring backend given or,
            on the model backend, the machine's first real one); or ``"auto"``
            (default: ``"live"`` on the ``cpu`` and ``cuda`` backends, whose
            telemetry leaves our own work out; ``None`` on the others, and
            where the devices cannot be read or the reading has no capacity,
            only a utilisation that counts our own runs (NVML listing no
            compute processes), which :meth:`notes` then says).
        backend_options: passed to the backend (``seed``, ``repeats``...).

    Raises:
        ValueError: ``telemetry`` is a string other than ``"live"`` or
            ``"auto"``.
        TelemetryError: ``"live"`` on a machine with no real backend.
    """

    def __init__(self, policy: Policy | str | Path | None = None,
                 machine: str | Machine = "hetero-4",
                 backend: str | Backend = "model",
                 telemetry: Snapshot | str | None = AUTO, **backend_options: Any):
        if isinstance(policy, (str, Path)):
            policy = make_policy(str(policy))
        self.policy = policy or default_policy()
        self.machine = load_machine(machine)
        self._backend_spec = backend
        self._backend_options = backend_options
        self._backend: Backend | None = None if isinstance(backend, str) else backend
        self._unavailable = False  # the backend could not be made here
        self.telemetry = telemetry

    @property
    def telemetry(self) -> Snapshot | None:
        """The devices' state the next decision is made under: the snapshot
        given, or the live one (read afresh once it is
        :data:`LIVE_MAX_AGE_S` old).

        Raises:
            TelemetryError: ``telemetry="live"`` and the devices cannot be read.
        """
        if self._live_backend is None:
            return self._fixed
        now = time.monotonic()
        if self._live is None or now - self._live[0] > LIVE_MAX_AGE_S:
            try:
                snap = live_snapshot(self.machine, self._live_backend)
                if self._auto and snap.capacity is None:
                    raise TelemetryError(
                        f"{snap.source} telemetry gives utilisation only, which "
                        "counts our own runs as load (telemetry='live' uses it)")
            except TelemetryError as exc:
                if not self._auto or self._live is not None:
                    raise
                # auto, and never read here: decide without, and say so
                self._telemetry_note = f"deciding without telemetry: {exc}"
                self._live_backend = None
                return None
            self._live = (time.monotonic(), snap)
        return self._live[1]

    @telemetry.setter
    def telemetry(self, telemetry: Snapshot | str | None) -> None:
        """What the next decisions are made under, as the constructor's
        ``telemetry`` takes it (a live reading kept so far is dropped)."""
        self._telemetry_note: str | None = None
        self._live: tuple[float, Snapshot] | None = None
        self._fixed: Snapshot | None = None
        #: the backend whose devices are read live (None: a fixed snapshot)
        self._live_backend: str | None = None
        self._auto = isinstance(telemetry, str) and telemetry == AUTO
        if not isinstance(telemetry, str):
            self._fixed = telemetry
            if self._backend is not None and self._backend_spec == "model":
                self._backend.telemetry = telemetry  # the model predicts under it
            return
        if telemetry not in (LIVE, AUTO):
            raise ValueError(f"telemetry {telemetry!r}: expected a Snapshot, "
                             f"None, {LIVE!r} or {AUTO!r}")
        backend = self._backend if self._backend is not None else self._backend_spec
        name = backend if isinstance(backend, str) else getattr(backend, "name", "")
        if name in (AUTO_LIVE_BACKENDS if self._auto else MEASURING_BACKENDS):
            self._live_backend = name
        elif telemetry == LIVE:
            real = tuple(getattr(self.machine, "real_backends", ()) or ())
            if not real:
                raise TelemetryError(f"telemetry 'live': machine "
                                     f"{self.machine.name} is simulated; it has "
                                     "no devices to read")
            self._live_backend = real[0]

    @property
    def backend(self) -> Backend:
        """The execution backend (created on first use)."""
        if self._backend is None:
            options = dict(self._backend_options)
            if self._backend_spec == "model":
                options.setdefault("telemetry", self.telemetry)
            self._backend = get_backend(str(self._backend_spec), self.machine,
                                        **options)
        return self._backend

    def notes(self) -> list[str]:
        """Where this machine lies outside what the policy was trained on
        (more devices, card models it never met), whether the agent decides
        without the telemetry it looked for, and what of the machine's
        history was learned on devices it no longer has, one line each;
        empty otherwise, or for a policy that does not say."""
        notes = getattr(self.policy, "notes", None)
        out = list(notes(self.machine)) if callable(notes) else []
        out += [self._telemetry_note] if self._telemetry_note else []
        try:
            stale = History.peek(self.machine.name).stale(self.machine)
        except HistoryError:
            stale = {}  # a malformed history is refused where it is used
        if stale:
            out.append(f"history of {self.machine.name}: not used for "
                       f"{'; '.join(stale.values())}; a MEASURED run on the "
                       "machine forgets it")
        return out

    def validate(self, task: TaskSpec, decision: Any,
                 telemetry: Snapshot | None = None) -> Verdict:
        """Gate 1 on ``decision`` for ``task`` on this machine, under
        ``telemetry`` (default :attr:`telemetry`); never raises but for
        :class:`TelemetryError` where live telemetry cannot be read."""
        snap = self.telemetry if telemetry is None else telemetry
        return check_decision(decision, task, self.machine,
                              self._runnable_only(snap))

    def _runnable_only(self, snap: Snapshot | None) -> Snapshot | None:
        """``snap`` (an idle one where None) with the devices the backend
        cannot run on marked unhealthy; ``snap`` itself where it runs on
        all. The ``cuda`` backend is made for this before the first
        decision: which GPUs CUDA sees decides which the policy may use."""
        if self._backend is None:
            if self._backend_spec != "cuda" or self._unavailable:
                return snap
            try:
                backend = self.backend
            except BackendUnavailable:  # execute says so; decide as before
                self._unavailable = True
                return snap
        else:
            backend = self._backend
        runnable = getattr(backend, "runnable", None)
        if runnable is None or set(runnable) >= set(range(self.machine.n)):
            return snap
        base = snap if snap is not None else idle(self.machine)
        why_not = getattr(backend, "unrunnable_why", None)
        why = list(base.unhealthy_why or ("",) * self.machine.n)
        for i in range(self.machine.n):
            if i not in runnable:
                why[i] = why_not(i) if callable(why_not) else \
                    f"the {getattr(backend, 'name', '')} backend cannot run on it"
        return dataclasses.replace(base, healthy=tuple(
            bool(ok) and i in runnable for i, ok in enumerate(base.healthy)),
            unhealthy_why=tuple(why))

    def optimize(self, task: TaskSpec) -> Decision:
        """The policy's decision for ``task``, hashed and accepted by Gate 1.

        Raises:
            DecisionRejected: the policy produced a decision Gate 1 refuses.
        """
        snap = self._runnable_only(self.telemetry)
        decision = self.policy.decide(task, self.machine,
                                      self.seen_by_policy(task, snap))
        decision = decision.with_hash(task)
        verdict = self.validate(task, decision, snap)
        if not verdict.accepted:
            raise DecisionRejected(verdict)
        return decision

    def seen_by_policy(self, task: TaskSpec,
                       telemetry: Snapshot | None = None) -> Snapshot | None:
        """The telemetry the policy decides ``task`` under: the live snapshot
        with what the machine's history learned from MEASURED runs folded
        into each device's capacity (1, 2) or carried beside it (3):

        1. on a device other work contends for, what a shard of this task's
           length effectively gets there (a short shard on a busy core often
           runs as on a free one; :func:`~lib.costmodel.contention.effective_snapshot`),
           from the device's history, or where it has no figure yet from the
           calibration's (:func:`~lib.costmodel.contention.calibrated_bursts`);
        2. on a device that runs this kind slower than the fastest device,
           against the cost model, that fraction of its capacity
           (:func:`~lib.costmodel.speed.speed_snapshot`);
        3. on a device that costs a run more than the cheapest device beyond
           its time on the shard (waking its worker, handing over the job
           and the result), that cost as the device's wait, ``wait_s``
           (:func:`~lib.costmodel.overhead.overhead_snapshot`), which the
           cost model adds to the device's launch.

        ``telemetry``: the snapshot to start from (default :attr:`telemetry`).
        Unchanged without a measured capacity or without such history."""
        snap = self.telemetry if telemetry is None else telemetry
        if snap is None or snap.capacity is None:
            return snap
        history = History.peek(self.machine.name).fitting(self.machine)
        params = params_for(self.machine.name)
        lengths = equal_shard_seconds(task, self.machine, params,
                                      [i for i, ok in enumerate(snap.healthy) if ok])
        speeds = history.speeds(task.kind, task.dtype, lengths)
        raw = snap
        if min(snap.capacity) < 1.0:
            levels = {i: contention_level(c) for i, c in enumerate(snap.capacity)}
            # the device's own history first; the calibration's burst where
            # the history has no figure yet
            snap = effective_snapshot(task, self.machine, snap, params,
                                      {**calibrated_bursts(self.machine, params),
                                       **history.bursts(levels)})
        snap = speed_snapshot(snap, speeds)
        return overhead_snapshot(snap, list(history.overheads.values()),
                                 {i: level_of(c) for i, c in enumerate(raw.capacity)},
                                 lengths)

    def execute(self, task: TaskSpec, decision: Decision, *,
                verify: bool = False) -> Result:
        """Run ``decision`` after Gate 1 accepts it.

        Raises:
            DecisionRejected: Gate 1 refuses the decision (nothing runs).
            lib.costmodel.history.HistoryError: the machine's history, which a
                MEASURED run updates, is not a readable history (nothing runs:
                the run's result would have nowhere to go but away).
            lib.execution.ExecutionError: a device failed (no partial result).
        """
        snap = self.telemetry  # what the run starts under
        verdict = self.validate(task, decision, snap)
        if not verdict.accepted:
            raise DecisionRejected(verdict)
        if self.backend.measured:
            History.peek(self.machine.name)  # refuses a malformed file first
        result = self.backend.run(task, decision, verify=verify)
        if result.metrics.measured:  # MEASURED runs teach; PREDICTED ones cannot
            record_run(task, decision, result, snap, self.machine,
                       params_for(self.machine.name))
        return result

    def close(self) -> None:
        """Release the backend's workers or devices."""
        if self._backend is not None:
            self._backend.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
