"""A trained learner as a policy: ``decide(task, machine, telemetry) -> Decision``.

:class:`LearnedPolicy` puts a learner (a :class:`~lib.learners.ppo.PPOAgent` by
default; a :class:`~lib.learners.td3.TD3Agent` or a
:class:`~lib.learners.bandit.ShareBandit` too) behind the interface every baseline
answers, so the runtime drives it like any other policy. One decision:

1. the observation exactly as ``GPUHive-Split-v0`` shows it:
   :func:`lib.contract.encode_state` and :func:`lib.policies.actions.masks`, flattened
   in :data:`lib.policies.actions.OBS_KEYS` order (:class:`ObservationEncoder`);
2. the learner's deterministic action under the masks (PPO: the Dirichlet mean
   and the most probable option of each head, by a single-observation forward
   pass that skips the critic and the log-probabilities);
3. the action turned into a :class:`~lib.contract.Decision` the way the
   environment does (:func:`lib.policies.actions.project_share_row`, then
   :func:`lib.policies.actions.decision_from_weights_row`).

The decision is returned unhashed: the runtime hashes it and runs Gate 1.

Ablations (:class:`ObservationEncoder`):

- ``features``: ``"all"``; ``"no-telemetry"`` zeroes every device's ``util``,
  ``free_frac`` and ``healthy`` entries of the state; ``"no-topology"`` zeroes
  every device's ``peer_frac`` and ``log_host_bw`` (names from
  :data:`lib.contract.STATE_FIELDS`).
- ``use_mask=False``: the policy sees all-ones masks and acts as if every
  device slot and option were allowed; Gate 1 then refuses what is illegal
  (a comm path the machine lacks, a block a device cannot launch).

Policy files are :meth:`PPOAgent.save` files whose header carries
``spec = feature_spec()``; :func:`load_policy` refuses a file written for
another state layout or action vocabulary with a one-line message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lib.contract import BLOCKS, COMM_PATHS, MODES, Decision, TaskSpec
from lib.learners.distributions import concentration_forward
from lib.learners.ppo import PolicyFormatError, PPOAgent
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.policies.actions import (
    CHUNKS,
    OBS_KEYS,
    decision_from_weights_row,
    masks,
    project_share_row,
)
from lib.policies.observation import (
    STATE_DEVICES,
    STATE_DIM,
    STATE_FIELDS,
    STATE_VERSION,
    TASK_FEATURES,
    encode_state,
    encode_task,
)

#: Where the shipped policies live.
POLICY_DIR = Path(__file__).resolve().parent
#: The policy :func:`load_policy` loads without a path.
DEFAULT_POLICY = POLICY_DIR / "hetero-4.npz"

#: Feature sets of the ablation and the per-device state entries each zeroes.
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "all": (),
    "no-telemetry": ("util", "free_frac", "healthy"),
    "no-topology": ("peer_frac", "log_host_bw"),
}
#: Discrete heads of the learned policy, in order, with their mask keys.
HEADS: tuple[str, ...] = ("block", "mode", "comm_path", "chunks")
HEAD_SIZES: tuple[int, ...] = (len(BLOCKS), len(MODES), len(COMM_PATHS), len(CHUNKS))
HEAD_MASKS: tuple[str | None, ...] = ("block_mask", "mode_mask", "path_mask", None)
#: Length of the flat observation (state plus the four masks).
OBS_DIM = STATE_DIM + STATE_DEVICES + len(MODES) + len(COMM_PATHS) + len(BLOCKS)


def feature_spec() -> dict[str, Any]:
    """What a policy file must have been trained on: state layout and action
    vocabulary. :func:`load_policy` compares it with the file's header."""
    return {"state_version": STATE_VERSION,
            "state_fields": [name for name, _ in STATE_FIELDS],
            "obs_keys": list(OBS_KEYS), "blocks": list(BLOCKS),
            "chunks": list(CHUNKS), "modes": list(MODES),
            "comm_paths": list(COMM_PATHS), "heads": list(HEADS)}


def feature_keep(features: str = "all") -> np.ndarray:
    """``(STATE_DIM,)`` float64: 0 for the state entries ``features`` zeroes."""
    if features not in FEATURE_SETS:
        raise ValueError(f"features {features!r}: expected one of "
                         f"{', '.join(FEATURE_SETS)}")
    dropped = set(FEATURE_SETS[features])
    return np.array([0.0 if name.rsplit(".", 1)[-1] in dropped else 1.0
                     for name, _ in STATE_FIELDS])


class ObservationEncoder:
    """Environment observations as the learner's flat input, with the ablations.

    Args:
        features: ``"all"``, ``"no-telemetry"`` or ``"no-topology"``.
        use_mask: False shows the learner all-ones masks and acts unmasked.
    """

    def __init__(self, features: str = "all", use_mask: bool = True) -> None:
        self.features = features
        self.use_mask = bool(use_mask)
        self.keep = feature_keep(features)

    def flat(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """``(..., OBS_DIM)`` float64 for an observation dict (batch axes kept)."""
        state = np.asarray(obs["state"], dtype=np.float64) * self.keep
        parts = [state]
        for key in OBS_KEYS[1:]:
            m = np.asarray(obs[key], dtype=np.float64)
            parts.append(m if self.use_mask else np.ones_like(m))
        return np.concatenate(parts, axis=-1)

    def masks(self, obs: Mapping[str, np.ndarray]
              ) -> tuple[np.ndarray | None, list[np.ndarray | None] | None]:
        """Device mask and one mask per head of :data:`HEADS` (bool), or
        ``(None, None)`` without masks."""
        if not self.use_mask:
            return None, None
        return (np.asarray(obs["device_mask"]) != 0,
                [None if k is None else np.asarray(obs[k]) != 0 for k in HEAD_MASKS])


def action_from_choices(shares: np.ndarray, choices: Sequence[int] | np.ndarray
                        ) -> dict[str, Any]:
    """An environment action from shares ``(..., 8)`` and head choices
    ``(..., 4)`` in :data:`HEADS` order."""
    ch = np.asarray(choices)
    return {"shares": np.asarray(shares), **{h: ch[..., i]
                                             for i, h in enumerate(HEADS)}}


class LearnedPolicy:
    """A learner behind ``decide(task, machine, telemetry) -> Decision``.

    Args:
        learner: a :class:`PPOAgent` (fast path), or anything with
            ``propose(obs, device_mask, discrete_masks) -> (shares, choices)``
            over the flat observation and the heads of :data:`HEADS`.
        name: the policy's name (default ``"rl-ppo"``, ``"rl-td3"``...).
        features, use_mask: the ablations (:class:`ObservationEncoder`).
        min_share: shares below this fraction are dropped, as in the
            environment (1e-3).
        header: what the policy file said (training summary), if loaded.
    """

    def __init__(self, learner: Any, *, name: str | None = None,
                 features: str = "all", use_mask: bool = True,
                 min_share: float = 1e-3,
                 header: Mapping[str, Any] | None = None) -> None:
        self.learner = learner
        kind = {"PPOAgent": "ppo", "TD3Agent": "td3", "ShareBandit": "bandit"}.get(
            type(learner).__name__, type(learner).__name__.lower())
        self.name = name or f"rl-{kind}"
        self.encoder = ObservationEncoder(features, use_mask)
        self.min_share = float(min_share)
        self.header = dict(header or {})
        self._x = np.zeros(OBS_DIM)
        self._ones = np.ones(OBS_DIM - STATE_DIM)
        self._slices = getattr(learner, "_slices", None)
        self._task = np.zeros(TASK_FEATURES, dtype=np.float32)
        self._h = np.empty(OBS_DIM)
        self._scratch: list[np.ndarray] = []
        self._scratch_for: Any = None
        #: What the machine and telemetry contribute to an observation, keyed
        #: by (dtype, merge), valid for the objects in ``_context_of``.
        self._context_of: tuple[Any, ...] = ()
        self._context: dict[tuple[str, str], _Context] = {}

    @property
    def features(self) -> str:
        return self.encoder.features

    @property
    def use_mask(self) -> bool:
        return self.encoder.use_mask

    def _context_for(self, task: TaskSpec, machine: Machine,
                     telemetry: Snapshot | None) -> _Context:
        """The task-independent part of the observation for ``task``'s dtype
        and merge on ``machine`` under ``telemetry``.

        Machines and snapshots are frozen, so the cache holds the objects
        themselves and compares identity: another machine, another snapshot or
        another encoder starts a fresh cache. A miss computes everything with
        :func:`encode_state` and :func:`masks`, so a hit gives the same bits.
        """
        key = (machine, telemetry, self.encoder)
        if len(self._context_of) != 3 or any(
                a is not b for a, b in zip(key, self._context_of, strict=True)):
            self._context_of, self._context = key, {}
        ctx = self._context.get((task.dtype, task.merge))
        if ctx is None:
            ctx = _Context(task, machine, telemetry, self.encoder)
            if len(self._context) < 64:
                self._context[task.dtype, task.merge] = ctx
        return ctx

    def observe(self, task: TaskSpec, machine: Machine,
                telemetry: Snapshot | None = None
                ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The flat observation ``(OBS_DIM,)`` (a view into a reused buffer)
        and the environment's masks for ``task`` on ``machine`` (read-only
        arrays, shared between calls)."""
        x, ctx = self._observe(task, machine, telemetry)
        return x, ctx.masks

    def _observe(self, task: TaskSpec, machine: Machine,
                 telemetry: Snapshot | None) -> tuple[np.ndarray, _Context]:
        ctx = self._context_for(task, machine, telemetry)
        t = self._task
        t.fill(0.0)
        encode_task(task, t)
        x = self._x
        np.multiply(t, ctx.keep_task, out=x[:TASK_FEATURES])
        x[TASK_FEATURES:] = ctx.rest
        return x, ctx

    def _ppo_act(self, x: np.ndarray, ctx: _Context
                 ) -> tuple[list[float], list[int]]:
        """Deterministic PPO action for one observation: actor only, no copies
        of the weights, no distribution objects, no allocations but the small
        lists returned."""
        agent: PPOAgent = self.learner
        h = x
        if agent.config.normalize_obs:
            rms = agent.obs_rms
            h = self._h
            # np.clip((x - mean) / sqrt(var + eps), -clip, clip), in place
            np.subtract(x, rms.mean, out=h)
            np.divide(h, np.sqrt(rms.var + rms.eps), out=h)
            np.maximum(h, -rms.clip, out=h)
            np.minimum(h, rms.clip, out=h)
        actor = agent.actor
        if self._scratch_for is not actor:
            self._scratch_for, self._scratch = actor, actor.scratch()
        out = actor.forward_one(h, self._scratch)
        alpha = concentration_forward(out[self._slices[0]],
                                      agent.config.alpha_min).tolist()
        values = out.tolist()
        if ctx.usable is not None:
            alpha = [a if u else 0.0 for a, u in zip(alpha, ctx.usable, strict=True)]
        choices = [_argmax(values[s], allowed)
                   for s, allowed in zip(self._slices[1:], ctx.allowed, strict=True)]
        return alpha, choices

    def act(self, task: TaskSpec, machine: Machine,
            telemetry: Snapshot | None = None
            ) -> tuple[np.ndarray, list[int], dict[str, np.ndarray]]:
        """Raw deterministic action: shares ``(8,)``, choices per head, masks."""
        shares, choices, ctx = self._act(task, machine, telemetry)
        return np.asarray(shares, dtype=np.float64), choices, ctx.masks

    def _act(self, task: TaskSpec, machine: Machine, telemetry: Snapshot | None
             ) -> tuple[list[float], list[int], _Context]:
        x, ctx = self._observe(task, machine, telemetry)
        if isinstance(self.learner, PPOAgent):
            shares, choices = self._ppo_act(x, ctx)
            return shares, choices, ctx
        dmask, cmasks = self.encoder.masks(ctx.masks)
        shares, choices = self.learner.propose(x.copy(), dmask, cmasks)
        shares = np.asarray(shares, dtype=np.float64).tolist()
        return shares, [int(c) for c in choices], ctx

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        """The policy's decision for ``task`` (not hashed, not yet gated)."""
        shares, ch, ctx = self._act(task, machine, telemetry)
        weights = project_share_row(shares, ctx.device, ch[1], self.min_share)
        return decision_from_weights_row(task, weights, ch[0], ch[1], ch[2], ch[3],
                                         hashed=False)

    def save(self, path: str | Path, summary: Mapping[str, Any] | None = None
             ) -> Path:
        """Write the (PPO) learner with the feature spec and ``summary`` in the
        header; :func:`load_policy` reads it back."""
        if not isinstance(self.learner, PPOAgent):
            raise TypeError(f"only PPO policies are saved as files, not "
                            f"{type(self.learner).__name__}")
        header = {"spec": feature_spec(), "name": self.name,
                  "features": self.features, "use_mask": self.use_mask,
                  "min_share": self.min_share,
                  "summary": json.loads(json.dumps(dict(summary or {}),
                                                   default=float))}
        return self.learner.save(path, header)


def _argmax(values: Sequence[float], allowed: Sequence[Any] | None) -> int:
    """``np.argmax`` of ``values`` with disallowed entries at ``-inf`` (the
    first maximum; a NaN wins as in numpy), on a handful of floats."""
    best, at = -math.inf, 0
    for i, v in enumerate(values):
        if allowed is not None and not allowed[i]:
            continue
        if v != v:
            return i
        if v > best:
            best, at = v, i
    return at


class _Context:
    """What a machine under one telemetry snapshot contributes to an
    observation of a task with a given dtype and merge.

    Attributes:
        keep_task: ``(TASK_FEATURES,)`` the feature mask of the task entries.
        rest: the state past the task entries and the flat masks, float64,
            features already zeroed (the observation's tail).
        masks: the environment's masks (read-only int8 arrays).
        device: the device mask as a list of bools.
        usable: ``device`` where the policy acts masked, else ``None``.
        allowed: per head of :data:`HEADS`, the allowed options as a list of
            bools, or ``None`` (unmasked head or unmasked policy).
    """

    __slots__ = ("allowed", "device", "keep_task", "masks", "rest", "usable")

    def __init__(self, task: TaskSpec, machine: Machine,
                 telemetry: Snapshot | None, encoder: ObservationEncoder) -> None:
        m = masks(task, machine, telemetry)
        for v in m.values():
            v.flags.writeable = False
        state = encode_state(task, machine, telemetry) * encoder.keep
        parts = [state[TASK_FEATURES:]]
        for key in OBS_KEYS[1:]:
            parts.append(np.asarray(m[key], dtype=np.float64) if encoder.use_mask
                         else np.ones(m[key].size))
        self.keep_task = encoder.keep[:TASK_FEATURES].copy()
        self.rest = np.concatenate(parts)
        self.masks = m
        self.device = (m["device_mask"] != 0).tolist()
        use = encoder.use_mask
        self.usable = self.device if use else None
        self.allowed = [(m[key] != 0).tolist() if use and key is not None else None
                        for key in HEAD_MASKS]


def load_policy(path: str | Path | None = None, *, features: str | None = None,
                use_mask: bool | None = None) -> LearnedPolicy:
    """A :class:`LearnedPolicy` from a policy file (default: the shipped
    ``lib/policies/hetero-4.npz``).

    ``features`` and ``use_mask`` default to what the file was trained with.

    Raises:
        PolicyFormatError: missing or unreadable file, or a file trained for
            another feature spec (one line naming what differs).
    """
    path = Path(path) if path is not None else DEFAULT_POLICY
    if not path.is_file():
        raise PolicyFormatError(f"policy file {path} does not exist; train one "
                                "with `gpuhive train`")
    try:
        agent = PPOAgent.load(path, expected_spec=feature_spec())
    except PolicyFormatError as exc:
        line = str(exc).splitlines()[0]
        raise PolicyFormatError(f"{line} (the policy was trained for another "
                                "state layout; retrain it)") from None
    head = agent.loaded_header or {}
    return LearnedPolicy(agent, name=head.get("name"),
                         features=features or head.get("features", "all"),
                         use_mask=head.get("use_mask", True) if use_mask is None
                         else use_mask,
                         min_share=head.get("min_share", 1e-3), header=head)
