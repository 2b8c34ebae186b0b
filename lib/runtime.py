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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lib.contract import Decision, TaskSpec
from lib.costmodel.contention import (
    calibrated_bursts,
    contention_level,
    effective_snapshot,
)
from lib.costmodel.history import History, record_run
from lib.costmodel.overhead import level_of, overhead_snapshot
from lib.costmodel.parameters import params_for
from lib.costmodel.speed import equal_shard_seconds, speed_snapshot
from lib.execution import Backend, Result, get_backend
from lib.platform.machines import Machine, load_machine
from lib.platform.telemetry import Snapshot
from lib.policies.baselines import Policy
from lib.policies.registry import default_policy, make_policy
from lib.security import Verdict, check_decision


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
        backend: ``"model"``, ``"cpu"`` or ``"cuda"``, or a backend object.
        telemetry: live state handed to Gate 1 and, with each device's
            capacity made effective for the task from the history
            (:meth:`seen_by_policy`), to the policy.
        backend_options: passed to the backend (``seed``, ``repeats``...).
    """

    def __init__(self, policy: Policy | str | Path | None = None,
                 machine: str | Machine = "hetero-4",
                 backend: str | Backend = "model",
                 telemetry: Snapshot | None = None, **backend_options: Any):
        if isinstance(policy, (str, Path)):
            policy = make_policy(str(policy))
        self.policy = policy or default_policy()
        self.machine = load_machine(machine)
        self.telemetry = telemetry
        self._backend_spec = backend
        self._backend_options = backend_options
        self._backend: Backend | None = None if isinstance(backend, str) else backend

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
        (more devices, card models it never met), one line each; empty
        inside it, or for a policy that does not say."""
        notes = getattr(self.policy, "notes", None)
        return list(notes(self.machine)) if callable(notes) else []

    def validate(self, task: TaskSpec, decision: Any) -> Verdict:
        """Gate 1 on ``decision`` for ``task`` on this machine (never raises)."""
        return check_decision(decision, task, self.machine, self.telemetry)

    def optimize(self, task: TaskSpec) -> Decision:
        """The policy's decision for ``task``, hashed and accepted by Gate 1.

        Raises:
            DecisionRejected: the policy produced a decision Gate 1 refuses.
        """
        decision = self.policy.decide(task, self.machine, self.seen_by_policy(task))
        decision = decision.with_hash(task)
        verdict = self.validate(task, decision)
        if not verdict.accepted:
            raise DecisionRejected(verdict)
        return decision

    def seen_by_policy(self, task: TaskSpec) -> Snapshot | None:
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

        Unchanged without a measured capacity or without such history."""
        snap = self.telemetry
        if snap is None or snap.capacity is None:
            return snap
        history = History.peek(self.machine.name)
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
            lib.execution.ExecutionError: a device failed (no partial result).
        """
        verdict = self.validate(task, decision)
        if not verdict.accepted:
            raise DecisionRejected(verdict)
        result = self.backend.run(task, decision, verify=verify)
        if result.metrics.measured:  # MEASURED runs teach; PREDICTED ones cannot
            record_run(task, decision, result, self.telemetry, self.machine,
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
