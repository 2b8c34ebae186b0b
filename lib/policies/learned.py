"""A trained learner as a policy: ``decide(task, machine, telemetry) -> Decision``.

:class:`LearnedPolicy` puts a learner behind the interface every baseline
answers. The shipped one is a :class:`~lib.learners.setppo.SetPPOAgent`: one
policy for every machine, whatever its number and order of devices. One
decision:

1. the state (:func:`lib.policies.observation.encode_state`: the task row and a
   row per usable device, kept per machine and snapshot where they do not
   depend on the task) and the masks (:class:`lib.policies.actions.Decoder`);
2. the learner's deterministic action: the mean shares ``softmax(z)`` over the
   usable devices and the most probable allowed option of each head, by one
   forward pass of the actor alone (:meth:`SetNet.forward_one`);
3. the action turned into a :class:`~lib.contract.Decision` by the decoder, which
   applies the masks Gate 1's local rules need (memory per shard, the path
   the chosen devices can take, the block they can launch).

Other learners (:class:`~lib.learners.ppo.PPOAgent`,
:class:`~lib.learners.td3.TD3Agent`, :class:`~lib.learners.bandit.ShareBandit`)
have a fixed number of device slots;
they see the environment's observation flattened over that many slots
(:meth:`ObservationEncoder.flat`) and answer ``propose(obs, device_mask,
discrete_masks)``.

The decision is returned unhashed: the runtime hashes it and runs Gate 1.

Ablations (:class:`ObservationEncoder`):

- ``features``: ``"all"``; ``"no-telemetry"`` zeroes every device's ``util``
  and ``free_frac`` (and the set's mean utilisation); ``"no-topology"`` zeroes
  every device's host-link and peer-link entries (and the set's
  ``p2p_pairs``), names from :data:`lib.policies.observation.DEVICE_FIELDS`;
- ``use_mask=False``: the heads see every option allowed and the decision is
  built without the decoder's masks; Gate 1 then refuses what is illegal.

Policy files are :meth:`SetPPOAgent.save` files whose header carries ``spec =
feature_spec()`` and what the policy was trained on; :func:`load_policy` refuses
a file written for another state layout (an eight-slot policy of state
version 1, say) with a one-line message.

Why one module: the encoder, the fast decision path (which folds the
task-independent parts of the state into the first layer) and the policy file
read one layout of the state and of the actor's outputs; the fast path must
give the batch network's values, and is checked against it in one place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lib.contract import (
    BLOCKS,
    COMM_PATHS,
    MODES,
    Decision,
    NoFeasibleDecision,
    TaskSpec,
)
from lib.costmodel.overhead import fold_wait, leave_out_waits
from lib.costmodel.parameters import params_for
from lib.learners.ppo import PolicyFormatError
from lib.learners.setppo import SetPPOAgent
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import whole_work
from lib.policies import fastpath
from lib.policies.actions import (
    CHUNKS,
    SLOTS,
    Decoder,
    decision_from_weights_row,
    observe,
    project_share_row,
)
from lib.policies.observation import (
    DEVICE_FEATURES,
    DEVICE_FIELDS,
    SEPARABLE_FIELDS,
    STATE_VERSION,
    TASK_DEVICE_FIELDS,
    TASK_FEATURES,
    TASK_FIELDS,
    TELEMETRY_FIELDS,
    TOPOLOGY_FIELDS,
    MachineView,
    device_rows,
    encode_task,
    task_logs,
    task_terms,
)

#: Where the shipped policy lives.
POLICY_DIR = Path(__file__).resolve().parent
#: The policy :func:`load_policy` loads without a path: one for every machine.
DEFAULT_POLICY = POLICY_DIR / "catalog.npz"

#: Feature sets of the ablation: the device entries each zeroes, and the
#: task row's set entries.
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "all": (),
    "no-telemetry": TELEMETRY_FIELDS + ("set.mean_util",),
    "no-topology": TOPOLOGY_FIELDS + ("set.p2p_pairs",),
}
#: Discrete heads of the learned policy, in order, with their mask keys.
HEADS: tuple[str, ...] = ("block", "mode", "comm_path", "chunks")
HEAD_SIZES: tuple[int, ...] = (len(BLOCKS), len(MODES), len(COMM_PATHS), len(CHUNKS))
HEAD_MASKS: tuple[str | None, ...] = ("block_mask", "mode_mask", "path_mask", None)
#: Length of the flat observation of one device slot past the task row.
MASK_WIDTH = len(MODES) + len(COMM_PATHS) + len(BLOCKS)


def flat_dim(slots: int, with_masks: bool) -> int:
    """Length of :meth:`ObservationEncoder.flat` rows for ``slots`` devices."""
    return TASK_FEATURES + slots * DEVICE_FEATURES + (
        slots + MASK_WIDTH if with_masks else 0)


def feature_spec() -> dict[str, Any]:
    """What a policy file must have been trained on: state layout and action
    vocabulary. :func:`load_policy` compares it with the file's header."""
    return {"state_version": STATE_VERSION,
            "task_fields": [name for name, _ in TASK_FIELDS],
            "device_fields": [name for name, _ in DEVICE_FIELDS],
            "blocks": list(BLOCKS), "chunks": list(CHUNKS), "modes": list(MODES),
            "comm_paths": list(COMM_PATHS), "heads": list(HEADS)}


def feature_keep(features: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """``(task (TASK_FEATURES,), device (DEVICE_FEATURES,))`` float64: 0 for
    the entries ``features`` zeroes, else 1."""
    if features not in FEATURE_SETS:
        raise ValueError(f"features {features!r}: expected one of "
                         f"{', '.join(FEATURE_SETS)}")
    dropped = set(FEATURE_SETS[features])
    return (np.array([0.0 if n in dropped else 1.0 for n, _ in TASK_FIELDS]),
            np.array([0.0 if n in dropped else 1.0 for n, _ in DEVICE_FIELDS]))


class ObservationEncoder:
    """Environment observations as a learner's flat input, with the ablations.

    Args:
        features: ``"all"``, ``"no-telemetry"`` or ``"no-topology"``.
        use_mask: False shows the heads all-ones masks (and acts unmasked).
        slots: device slots of a fixed-size learner (PPO, TD3); None (a set
            learner): as many as the batch's last usable device needs.
    """

    def __init__(self, features: str = "all", use_mask: bool = True,
                 slots: int | None = None) -> None:
        self.features = features
        self.use_mask = bool(use_mask)
        self.keep_task, self.keep_device = feature_keep(features)
        self.slots = slots

    def width(self, obs: Mapping[str, np.ndarray]) -> int:
        """Device slots of :meth:`flat` for ``obs`` (a batch or one)."""
        if self.slots is not None:
            return self.slots
        used = np.flatnonzero(np.asarray(obs["device_mask"]).reshape(
            -1, SLOTS).any(axis=0))
        return int(used[-1]) + 1 if used.size else 1

    def flat(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """``(..., flat_dim)`` float64: the task row, then the device rows of
        :meth:`width` slots; a fixed-size learner's rows end with the masks
        (all ones where ``use_mask`` is off)."""
        n = self.width(obs)
        task = np.asarray(obs["task"], dtype=np.float64) * self.keep_task
        dev = np.asarray(obs["devices"], dtype=np.float64)[..., :n, :] \
            * self.keep_device
        parts = [task, dev.reshape(*dev.shape[:-2], -1)]
        if self.slots is not None:
            for key in ("device_mask", "mode_mask", "path_mask", "block_mask"):
                m = np.asarray(obs[key], dtype=np.float64)
                m = m[..., :n] if key == "device_mask" else m
                parts.append(m if self.use_mask or key == "device_mask"
                             else np.ones_like(m))
        return np.concatenate(parts, axis=-1)

    def masks(self, obs: Mapping[str, np.ndarray]
              ) -> tuple[np.ndarray, list[np.ndarray | None]]:
        """Device mask over :meth:`width` slots and one mask per head of
        :data:`HEADS` (bool; None where unmasked)."""
        n = self.width(obs)
        dmask = np.asarray(obs["device_mask"])[..., :n] != 0
        if not self.use_mask:
            return dmask, [None] * len(HEADS)
        return dmask, [None if k is None else np.asarray(obs[k]) != 0
                       for k in HEAD_MASKS]


def action_from_choices(shares: np.ndarray, choices: Sequence[int] | np.ndarray,
                        slots: int = SLOTS) -> dict[str, Any]:
    """An environment action from shares ``(..., n)`` (padded to ``slots``)
    and head choices ``(..., 4)`` in :data:`HEADS` order."""
    s = np.asarray(shares)
    pad = [(0, 0)] * (s.ndim - 1) + [(0, slots - s.shape[-1])]
    ch = np.asarray(choices)
    return {"shares": np.pad(s, pad), **{h: ch[..., i] for i, h in enumerate(HEADS)}}


#: The first inputs of a device in the fast path (:class:`_Context`), log10
#: seconds: the :data:`TASK_DEVICE_FIELDS` before their scaling, and third
#: the compute time (``None``: not a state entry, weight zero), so that one
#: reduction over the first three gives ``cost_pipe`` and one ``cost_split``.
_TERMS: tuple[str | None, ...] = ("t_in", "t_out", None, "t_fixed", "cost_split",
                                  "cost_pipe")


class _Context:
    """What one machine under one snapshot contributes to a decision of a
    task with a given dtype: the task-independent state, the decoder, and
    for a set learner the task-independent parts of its network, folded
    into weights so that one decision is one call of the compiled kernel
    :func:`lib.policies.fastpath.act` (:meth:`LearnedPolicy._kernel`).

    The network's inputs enter linearly before the first nonlinearity, so
    every part that does not depend on the task is folded in here:

    - the device rows' own entries (figures, telemetry, links) and the device
      part of the separable entries (:data:`SEPARABLE_FIELDS`: a task scalar
      minus a device constant) into ``first`` (the first layer) and ``skip``
      (the share outputs' skip, with its bias);
    - the scaling ``(x + 4) / 3`` of the :data:`TASK_DEVICE_FIELDS` entries
      into their weights and those biases;
    - the feature ablation (``keep``) into every weight;
    - the mean pools' ``1 / k`` and the biases of the set layers into their
      weights (the pooled vectors end with a constant 1).

    The task enters as ``ext`` = [task row, the task part of the separable
    entries (3), 1] (:data:`TASK_FEATURES` + 4 entries). Per decision:

    - ``x`` ``(k, 6 + len(ext))``, one row per usable device: the
      six :data:`_TERMS` (log10 seconds), then ``ext``; ``x @ w1x + first``
      is the first layer's input, ``x @ wzx + skip`` the shares' skip
      (``first`` and ``skip`` are added after the product, not picked by a
      one-hot column in it, so that identical devices get identical rows
      whatever their position);
    - ``g1`` = [sum, max of the first layer over the devices, 1] and
      ``v2t @ g1`` the second layer's pooled input (with ``b2``);
    - ``g2`` = [sum, max of the second layer, ext] and ``w3t @ g2`` the set
      layer's input (with ``b3``); ``h3`` = [that layer, 1] and ``wyt @ h3``
      the heads' logits (with ``by``).

    Per task, only the six :data:`_TERMS` columns are computed per device
    (``ext`` is the same in every row: the kernel takes its products once).
    """

    __slots__ = ("allowed", "bounds", "decoder", "ext0", "first", "index", "inv",
                 "k", "lat", "share_head", "skip", "task_set", "v2t", "version",
                 "view", "w1x", "w2", "w3t", "wyt", "wz", "wzx")

    def __init__(self, machine: Machine, telemetry: Snapshot | None, dtype: str,
                 min_share: float, encoder: ObservationEncoder,
                 learner: Any) -> None:
        self.view = view = MachineView(machine, telemetry, dtype)
        self.decoder = Decoder(machine, telemetry, min_share)
        self.index = list(view.index)
        keep_task, keep_dev = encoder.keep_task, encoder.keep_device
        self.task_set = view.task_set * keep_task[TASK_FEATURES
                                                  - len(view.task_set):]
        self.version = _version(learner)
        if not isinstance(learner, SetPPOAgent):
            return
        p = learner.actor.params
        c = TASK_FEATURES
        self.k = k = len(self.index)
        sep = [_DEV[n] for n in SEPARABLE_FIELDS]
        dyn = [_DEV[n] for n in TASK_DEVICE_FIELDS]
        rows = view.static.copy()
        rows[:, sep[0]] = (4.0 - view.log_peak_eff) / 3.0
        rows[:, sep[1]] = (4.0 - view.log_bw_eff) / 3.0
        rows[:, sep[2]] = view.log_room / 3.0
        rows *= keep_dev
        w1 = p["W1"][c:] * keep_dev[:, None]
        ws = p["Ws"] * keep_dev[:, None]
        # (L + 4) / 3 @ W = L @ (W / 3) + 4/3 of W's rows summed
        w_dyn, ws_dyn = w1[dyn] / 3.0, ws[dyn] / 3.0
        first = rows @ w1 + p["b1"] + 4.0 * w_dyn.sum(axis=0)
        skip = rows @ ws + p["bz"] + 4.0 * ws_dyn.sum(axis=0)
        h1 = w1.shape[1]
        width = p["W2"].shape[1] if "W2" in p else h1
        ne = c + len(sep) + 1  # ext: task row, separable task parts, 1
        n_terms = len(_TERMS)
        at = {name: i for i, name in enumerate(TASK_DEVICE_FIELDS)}
        term_rows = [i for i, name in enumerate(_TERMS) if name is not None]
        dyn_rows = [at[name] for name in _TERMS if name is not None]
        self.first, self.skip = first, skip
        e = n_terms  # where ext starts in a row of x
        self.w1x = np.zeros((e + ne, h1))
        self.w1x[term_rows] = w_dyn[dyn_rows]
        self.w1x[e:e + c] = p["W1"][:c] * keep_task[:, None]
        self.w1x[e + c:e + c + len(sep)] = w1[sep]
        self.wzx = np.zeros((e + ne, ws.shape[1]))
        self.wzx[term_rows] = ws_dyn[dyn_rows]
        self.wzx[e + c:e + c + len(sep)] = ws[sep]
        self.wz = np.ascontiguousarray(p["Wz"])
        self.w2 = np.zeros((0, 0))
        self.v2t = np.zeros((0, 0))
        if "W2" in p:  # [mean, max] @ V2 + b2 = [sum, max, 1] @ v2
            self.w2 = np.ascontiguousarray(p["W2"])
            self.v2t = np.ascontiguousarray(np.vstack(
                [p["V2"][:h1] / max(k, 1), p["V2"][h1:], p["b2"]]).T)
        w3 = np.zeros((2 * width + ne, p["W3"].shape[1]))
        w3[:width] = p["W3"][:width] / max(k, 1)
        w3[width:2 * width] = p["W3"][width:2 * width]
        w3[2 * width:2 * width + c] = p["W3"][2 * width:] * keep_task[:, None]
        w3[-1] = p["b3"]
        self.w3t = np.ascontiguousarray(w3.T)
        self.wyt = np.ascontiguousarray(np.vstack([p["Wy"], p["by"]]).T)
        # Per device, the terms' factors and offsets, rows in _TERMS order
        # and the memory time last: times = inv * scale + lat, scale = (b_in,
        # b_out, flops, fixed, 0, 0, traffic) of the task.
        self.inv = np.zeros((n_terms + 1, k))
        self.inv[[0, 1, 3]] = view.inv_host_bw
        self.inv[2] = view.inv_peak
        self.inv[n_terms] = view.inv_bw
        self.lat = np.zeros((n_terms + 1, k))
        self.lat[[0, 1, 3]] = view.host_lat
        self.ext0 = [0.0] * ne
        self.ext0[c - len(self.task_set):c] = self.task_set.tolist()
        self.ext0[-1] = 1.0
        slices = learner._slices
        self.bounds = np.array([s.start for s in slices] + [slices[-1].stop],
                               dtype=np.int64)
        self.share_head = int(learner.config.share_head)
        # the heads' allowed options as one array, per mask lists seen
        # (the decoder keeps those per merge while no memory cap binds)
        self.allowed: dict[int, tuple[Any, np.ndarray]] = {}

    def allowed_array(self, masks: tuple[Sequence[bool], ...]) -> np.ndarray:
        """The allowed options of the first heads (``masks``, one list each;
        the heads past them allow all) as one int8 array over the heads'
        logits, kept while ``masks`` is the decoder's cached tuple."""
        hit = self.allowed.get(id(masks))
        if hit is not None and hit[0] is masks:
            return hit[1]
        out = np.ones(int(self.bounds[-1]), dtype=np.int8)
        for h, mask in enumerate(masks):
            out[self.bounds[h]:self.bounds[h + 1]] = mask
        if len(self.allowed) > 64:
            self.allowed.clear()
        self.allowed[id(masks)] = (masks, out)
        return out


def _version(learner: Any) -> Any:
    """What changes when the learner's weights do (its optimiser's step)."""
    opt = getattr(learner, "optimizer", None)
    return getattr(opt, "t", None)


_DEV = {name: i for i, (name, _) in enumerate(DEVICE_FIELDS)}


class LearnedPolicy:
    """A learner behind ``decide(task, machine, telemetry) -> Decision``.

    Args:
        learner: a :class:`SetPPOAgent` (any machine), or anything with
            ``n_devices`` slots and ``propose(obs, device_mask,
            discrete_masks) -> (shares, choices)`` over the flat observation.
        name: the policy's name (default ``"rl-ppo"``, ``"rl-td3"``...).
        features, use_mask: the ablations (:class:`ObservationEncoder`).
        min_share: shares below this fraction are dropped, as in the
            environment (1e-3).
        header: what the policy file said (training summary, what it was
            trained on), if loaded.
    """

    def __init__(self, learner: Any, *, name: str | None = None,
                 features: str = "all", use_mask: bool = True,
                 min_share: float = 1e-3,
                 header: Mapping[str, Any] | None = None) -> None:
        self.learner = learner
        kind = {"SetPPOAgent": "ppo", "PPOAgent": "ppo-flat", "TD3Agent": "td3",
                "ShareBandit": "bandit"}.get(type(learner).__name__,
                                             type(learner).__name__.lower())
        self.name = name or f"rl-{kind}"
        self.is_set = isinstance(learner, SetPPOAgent)
        self.encoder = ObservationEncoder(
            features, use_mask, None if self.is_set else learner.n_devices)
        self.min_share = float(min_share)
        self.header = dict(header or {})
        self._task = np.zeros(TASK_FEATURES)
        self._of: tuple[Any, ...] = ()
        self._contexts: dict[str, _Context] = {}

    @property
    def features(self) -> str:
        return self.encoder.features

    @property
    def use_mask(self) -> bool:
        return self.encoder.use_mask

    def _context(self, task: TaskSpec, machine: Machine,
                 telemetry: Snapshot | None) -> _Context:
        """The cached context for ``task.dtype`` on ``machine`` under
        ``telemetry``. Machines and snapshots are frozen, so the cache holds
        the objects and compares identity: another machine or snapshot
        starts a fresh cache."""
        of = self._of
        if len(of) != 2 or of[0] is not machine or of[1] is not telemetry:
            self._of, self._contexts = (machine, telemetry), {}
        ctx = self._contexts.get(task.dtype)
        if ctx is None or ctx.version != _version(self.learner):
            ctx = _Context(machine, telemetry, task.dtype, self.min_share,
                           self.encoder, self.learner)
            self._contexts[task.dtype] = ctx
        return ctx

    def state(self, task: TaskSpec, machine: Machine,
              telemetry: Snapshot | None = None
              ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """What the policy sees: the task row ``(TASK_FEATURES,)`` (a reused
        buffer), the rows of the usable devices ``(k, DEVICE_FEATURES)`` and
        their machine indices; the ablations applied."""
        ctx = self._context(task, machine, telemetry)
        t = self._task
        t.fill(0.0)
        encode_task(task, t)
        t *= self.encoder.keep_task
        t[TASK_FEATURES - len(ctx.task_set):] = ctx.task_set
        rows = device_rows(ctx.view, task_terms(task)) * self.encoder.keep_device
        return t, rows, ctx.index

    def act(self, task: TaskSpec, machine: Machine,
            telemetry: Snapshot | None = None
            ) -> tuple[np.ndarray, list[int], dict[str, np.ndarray]]:
        """Raw deterministic action: shares ``(machine.n,)``, the head
        choices in :data:`HEADS` order, and the masks."""
        shares, choices, ctx = self._act(task, machine, telemetry)
        return np.asarray(shares), choices, ctx.decoder.masks(task, machine.n)

    def _act(self, task: TaskSpec, machine: Machine, telemetry: Snapshot | None
             ) -> tuple[list[float], list[int], _Context]:
        """Shares (one per device of ``machine``), the head choices and the
        context they were computed in."""
        if not self.is_set:
            return self._act_flat(task, machine, telemetry)
        ctx = self._context(task, machine, telemetry)
        index = ctx.index
        whole = whole_work(task)
        masks: tuple[Sequence[bool], ...] = ()  # block, mode, path: allowed
        usable = index
        if self.use_mask:
            device, masks = ctx.decoder.allowed(task, whole.footprint)
            usable = [i for i in index if device[i]]
            if not usable:
                raise NoFeasibleDecision(
                    f"no feasible decision for {task.describe()} on "
                    f"{machine.name}: no healthy device can hold even one row")
        if len(usable) == len(index):
            p, picked = self._kernel(task, ctx, whole, masks)
            choices = picked.tolist()
        else:  # a device too small for this task: the plain computation
            p, choices = self._plain(task, machine, telemetry, usable, masks)
        shares = [0.0] * machine.n
        for i, v in zip(usable, p.tolist(), strict=True):
            shares[i] = v
        return shares, choices, ctx

    def _plain(self, task: TaskSpec, machine: Machine, telemetry: Snapshot | None,
               usable: list[int], masks: tuple[Sequence[bool], ...]
               ) -> tuple[np.ndarray, list[int]]:
        """Shares over ``usable`` and the head choices by the actor's own
        forward pass on the rows of those devices (``masks``: as for
        :meth:`_kernel`)."""
        agent: SetPPOAgent = self.learner
        t, rows, index = self.state(task, machine, telemetry)
        z, y = agent.actor.forward_one(t, rows[[index.index(i) for i in usable]])
        values = y.tolist()
        heads = (*masks, *(None,) * (len(HEADS) - len(masks)))
        choices = [_argmax(values[s], allowed)
                   for s, allowed in zip(agent._slices, heads, strict=True)]
        h = agent.config.share_head
        c = 2 * (choices[h] if h >= 0 else 0)
        return fastpath.waterfill(np.ascontiguousarray(z[:, c]),
                                  np.ascontiguousarray(z[:, c + 1])), choices

    @staticmethod
    def _kernel(task: TaskSpec, ctx: _Context, whole: Any,
                masks: tuple[Sequence[bool], ...]
                ) -> tuple[np.ndarray, np.ndarray]:
        """Shares over every usable device and the head choices, from the
        folded weights of ``ctx`` (:class:`_Context`) by one call of the
        compiled :func:`lib.policies.fastpath.act`: the values of
        :meth:`SetNet.forward_one` on the task's state up to rounding
        (``whole``: the task's work as one shard; ``masks``: the allowed
        options of the first heads, the decoder's lists; the rest allow
        all)."""
        terms = task_terms(task, whole)
        c = TASK_FEATURES
        ext = ctx.ext0.copy()  # a list: item assignment costs less
        encode_task(task, ext, whole)
        lf, lm, lfoot = task_logs(terms)
        ext[c], ext[c + 1], ext[c + 2] = lf / 3.0, lm / 3.0, -lfoot / 3.0
        flops, traffic, b_in, b_out, fixed, _ = terms
        scale = (b_in, b_out, max(flops, 1.0), fixed, 0.0, 0.0, max(traffic, 1.0))
        return fastpath.act(tuple(ext), scale, ctx.inv, ctx.lat, ctx.w1x,
                               ctx.first, ctx.w2, ctx.v2t, ctx.w3t, ctx.wyt,
                               ctx.wzx, ctx.skip, ctx.wz,
                               ctx.allowed_array(masks), ctx.bounds,
                               ctx.share_head)

    def _act_flat(self, task: TaskSpec, machine: Machine,
                  telemetry: Snapshot | None
                  ) -> tuple[list[float], list[int], _Context]:
        """A fixed-slot learner: the environment's observation, flattened."""
        slots = self.encoder.slots
        if machine.n > slots:
            raise ValueError(f"{self.name} has {slots} device slots; "
                             f"{machine.name} has {machine.n} devices")
        ctx = self._context(task, machine, telemetry)
        obs = observe(task, machine, telemetry, decoder=ctx.decoder)
        x = self.encoder.flat(obs)
        dmask, cmasks = self.encoder.masks(obs)
        shares, choices = self.learner.propose(x, dmask, cmasks)
        out = [0.0] * machine.n
        for i in range(machine.n):
            out[i] = float(shares[i])
        return out, [int(c) for c in choices], ctx

    def decide(self, task: TaskSpec, machine: Machine,
               telemetry: Snapshot | None = None) -> Decision:
        """The policy's decision for ``task`` (not hashed, not yet gated).

        Where ``telemetry`` carries waits (``wait_s``, what devices cost a run
        beyond the cheapest, learned by the runtime's history), the network
        sees them folded into capacity (:func:`~lib.costmodel.overhead.fold_wait`),
        and its decision then loses each device whose wait costs more than
        its share saves (:func:`~lib.costmodel.overhead.leave_out_waits`):
        a network sees capacities, and no capacity says that a share of any
        size pays the whole wait."""
        waits = telemetry is not None and telemetry.wait_s is not None
        params = params_for(machine.name) if waits else None
        seen = fold_wait(task, machine, telemetry, params) if waits else telemetry
        shares, ch, ctx = self._act(task, machine, seen)
        if self.use_mask:
            decision = ctx.decoder.decide(task, shares, ch[0], ch[1], ch[2], ch[3],
                                          hashed=False)
        else:
            weights = project_share_row(shares, ctx.decoder.healthy, ch[1],
                                        self.min_share)
            decision = decision_from_weights_row(task, weights, ch[0], ch[1], ch[2],
                                                 ch[3], hashed=False)
        if waits:
            decision = leave_out_waits(task, decision, machine, telemetry, params)
        return decision

    def notes(self, machine: Machine) -> list[str]:
        """Where ``machine`` lies outside what the policy was trained on (more
        devices than any training machine, card models it never met), one
        line each; empty when it lies inside or the file does not say."""
        seen = self.header.get("trained_on") or {}
        out = []
        most = seen.get("max_devices")
        if most is not None and machine.n > most:
            out.append(f"{machine.name} has {machine.n} devices; the policy was "
                       f"trained on machines of at most {most}")
        models = seen.get("models")
        if models is not None:
            new = sorted({d.name for d in machine.devices if d.kind != "cpu"}
                         - set(models))
            if any(d.kind == "cpu" for d in machine.devices) \
                    and "cpu" not in seen.get("kinds", ["cpu"]):
                new.append("CPU cores")
            if new:
                out.append(f"the policy never met {', '.join(new)} in training "
                           "(zero-shot on this machine)")
        return out

    def save(self, path: str | Path, summary: Mapping[str, Any] | None = None,
             trained_on: Mapping[str, Any] | None = None) -> Path:
        """Write the (set PPO) learner with the feature spec, ``summary`` and
        ``trained_on`` in the header; :func:`load_policy` reads it back."""
        if not self.is_set:
            raise TypeError(f"only set PPO policies are saved as files, not "
                            f"{type(self.learner).__name__}")
        header = {"spec": feature_spec(), "name": self.name,
                  "features": self.features, "use_mask": self.use_mask,
                  "min_share": self.min_share,
                  "trained_on": dict(trained_on or self.header.get("trained_on")
                                     or {}),
                  "summary": json.loads(json.dumps(dict(summary or {}),
                                                   default=float))}
        return self.learner.save(path, header)


def _argmax(values: Sequence[float], allowed: Sequence[Any] | None) -> int:
    """``np.argmax`` of ``values`` with disallowed entries skipped (the first
    maximum; a NaN wins as in numpy), on a handful of floats."""
    best, at = -math.inf, 0
    for i, v in enumerate(values):
        if allowed is not None and not allowed[i]:
            continue
        if v != v:
            return i
        if v > best:
            best, at = v, i
    return at


def load_policy(path: str | Path | None = None, *, features: str | None = None,
                use_mask: bool | None = None) -> LearnedPolicy:
    """A :class:`LearnedPolicy` from a policy file (default: the shipped
    ``lib/policies/catalog.npz``).

    ``features`` and ``use_mask`` default to what the file was trained with.

    Raises:
        PolicyFormatError: missing or unreadable file, or a file trained for
            another state layout or action vocabulary (one line naming it).
    """
    path = Path(path) if path is not None else DEFAULT_POLICY
    if not path.is_file():
        raise PolicyFormatError(f"policy file {path} does not exist; train one "
                                "with `gpuhive train`")
    try:
        agent = SetPPOAgent.load(path, expected_spec=feature_spec())
    except PolicyFormatError as exc:
        line = str(exc).splitlines()[0]
        old = _old_version(path)
        if old is not None:
            line = (f"{path}: a policy for state version {old} (a fixed number "
                    f"of device slots); this code reads version {STATE_VERSION}")
        raise PolicyFormatError(f"{line} (the policy was trained for another "
                                "state layout; retrain it with `gpuhive train`)"
                                ) from None
    head = agent.loaded_header or {}
    return LearnedPolicy(agent, name=head.get("name"),
                         features=features or head.get("features", "all"),
                         use_mask=head.get("use_mask", True) if use_mask is None
                         else use_mask,
                         min_share=head.get("min_share", 1e-3), header=head)


def _old_version(path: Path) -> int | None:
    """The state version an older policy file names, if it names one."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            head = json.loads(str(npz["header"]))
        version = (head.get("spec") or {}).get("state_version")
        return int(version) if version is not None and version != STATE_VERSION \
            else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
