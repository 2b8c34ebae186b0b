"""A trained learner as a policy: ``decide(task, machine, telemetry) -> Decision``.

:class:`LearnedPolicy` puts a learner (a :class:`~lib.agent.ppo.PPOAgent` by
default; a :class:`~lib.agent.td3.TD3Agent` or a
:class:`~lib.agent.bandit.ShareBandit` too) behind the interface every baseline
answers, so the runtime drives it like any other policy. One decision:

1. the observation exactly as ``GPUHive-Split-v0`` shows it:
   :func:`lib.contract.encode_state` and :func:`lib.env.spaces.masks`, flattened
   in :data:`lib.env.spaces.OBS_KEYS` order (:class:`ObservationEncoder`);
2. the learner's deterministic action under the masks (PPO: the Dirichlet mean
   and the most probable option of each head, by a single-observation forward
   pass that skips the critic and the log-probabilities);
3. the action turned into a :class:`~lib.contract.Decision` the way the
   environment does (:func:`lib.env.spaces.project_shares`, then
   :func:`lib.env.spaces.decision_from_weights_row`).

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
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from lib.agent.distributions import concentration_forward
from lib.agent.ppo import PolicyFormatError, PPOAgent
from lib.contract import (
    COMM_PATHS,
    MODES,
    STATE_DEVICES,
    STATE_DIM,
    STATE_FIELDS,
    STATE_VERSION,
    Decision,
    TaskSpec,
    encode_state,
)
from lib.env.spaces import (
    BLOCKS,
    CHUNKS,
    OBS_KEYS,
    decision_from_weights_row,
    masks,
    project_shares,
)
from lib.machines import Machine
from lib.telemetry import Snapshot

#: Where the shipped policies live.
POLICY_DIR = Path(__file__).resolve().parent.parent / "policies"
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

    @property
    def features(self) -> str:
        return self.encoder.features

    @property
    def use_mask(self) -> bool:
        return self.encoder.use_mask

    def observe(self, task: TaskSpec, machine: Machine,
                telemetry: Snapshot | None = None
                ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The flat observation ``(OBS_DIM,)`` (a view into a reused buffer)
        and the environment's masks for ``task`` on ``machine``."""
        m = masks(task, machine, telemetry)
        x = self._x
        np.multiply(encode_state(task, machine, telemetry), self.encoder.keep,
                    out=x[:STATE_DIM])
        if self.encoder.use_mask:
            o = STATE_DIM
            for key in OBS_KEYS[1:]:
                x[o:o + m[key].size] = m[key]
                o += m[key].size
        else:
            x[STATE_DIM:] = self._ones
        return x, m

    def _ppo_act(self, x: np.ndarray, m: Mapping[str, np.ndarray]
                 ) -> tuple[np.ndarray, list[int]]:
        """Deterministic PPO action for one observation: actor only, no copies
        of the weights, no distribution objects."""
        agent: PPOAgent = self.learner
        h = x
        if agent.config.normalize_obs:
            rms = agent.obs_rms
            h = np.clip((x - rms.mean) / np.sqrt(rms.var + rms.eps),
                        -rms.clip, rms.clip)
        p = agent.actor.params
        last = agent.actor.n_layers - 1
        act = np.tanh if agent.actor.activation == "tanh" \
            else (lambda v: np.maximum(v, 0.0))
        for i in range(last):
            h = act(h @ p[f"W{i}"] + p[f"b{i}"])
        out = h @ p[f"W{last}"] + p[f"b{last}"]
        alpha = concentration_forward(out[self._slices[0]], agent.config.alpha_min)
        use = self.encoder.use_mask
        shares = np.where(m["device_mask"] != 0, alpha, 0.0) if use else alpha
        choices = []
        for s, key in zip(self._slices[1:], HEAD_MASKS, strict=True):
            logits = out[s]
            if use and key is not None:
                logits = np.where(m[key] != 0, logits, -np.inf)
            choices.append(int(np.argmax(logits)))
        return shares, choices

    def act(self, task: TaskSpec, machine: Machine,
            telemetry: Snapshot | None = None
            ) -> tuple[np.ndarray, list[int], dict[str, np.ndarray]]:
        """Raw deterministic action: shares ``(8,)``, choices per head, masks."""
        x, m = self.observe(task, machine, telemetry)
        if isinstance(self.learner, PPOAgent):
            shares, choices = self._ppo_act(x, m)
        else:
            dmask, cmasks = self.encoder.masks(m)
            shares, choices = self.learner.propose(x.copy(), dmask, cmasks)
        return np.asarray(shares, dtype=np.float64), list(choices), m

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        """The policy's decision for ``task`` (not hashed, not yet gated)."""
        shares, ch, m = self.act(task, machine, telemetry)
        weights = project_shares(shares[None], m["device_mask"][None],
                                 np.array([ch[1]]), self.min_share)
        decision = decision_from_weights_row(task, weights[0], ch[0], ch[1], ch[2],
                                             ch[3])
        return replace(decision, config_hash="")

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


def decision_latency(policy: Any, machine: Machine, tasks: Sequence[TaskSpec],
                     repeats: int = 5, telemetry: Snapshot | None = None
                     ) -> dict[str, float]:
    """Latency of a full decision as the runtime's ``optimize`` makes it:
    ``decide``, hash, Gate 1 (a benchmark: it measures, never fails).

    Returns:
        ``p50_us``, ``p99_us``, ``mean_us`` over ``len(tasks) * repeats``
        decisions, and ``refused`` (decisions Gate 1 refused).
    """
    import time

    from lib.security import check_decision

    for task in tasks[:20]:  # warm caches
        policy.decide(task, machine, telemetry)
    lat, refused = [], 0
    for _ in range(repeats):
        for task in tasks:
            t0 = time.perf_counter()
            decision = policy.decide(task, machine, telemetry).with_hash(task)
            ok = check_decision(decision, task, machine, telemetry).accepted
            lat.append(time.perf_counter() - t0)
            refused += not ok
    us = np.asarray(lat) * 1e6
    return {"p50_us": float(np.percentile(us, 50)),
            "p99_us": float(np.percentile(us, 99)),
            "mean_us": float(us.mean()), "decisions": len(lat),
            "refused": refused}
