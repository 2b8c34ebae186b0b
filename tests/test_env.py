"""The split environment: spaces, masks, Eq. (2), Gate 1, episode semantics,
stream occupancy, curriculum, the batch and the measured cpu backend."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import lib.env as env_pkg
from lib.contract import Decision, TaskSpec
from lib.env import (
    BLOCKS,
    HELD_OUT_MODELS,
    HELD_OUT_TOPOLOGIES,
    BatchModelEnv,
    Curriculum,
    EnvConfig,
    SplitEnv,
    action_from_decision,
    equal_split_action,
    flatten_observation,
    held_out_machines,
    sample_machine,
    sample_masked_action,
    sample_masked_actions,
    sample_task,
    unflatten_observation,
)
from lib.evaluation.bench import env_steps_per_second
from lib.execution import BackendUnavailable, ModelBackend
from lib.platform.workloads import workload
from lib.policies.actions import (
    SINGLE,
    SLOTS,
    decision_from_weights_row,
    project_share_row,
    project_shares,
)
from lib.policies.baselines import EqualSplit, ProportionalToPeak
from lib.policies.observation import DEVICE_FIELDS
from lib.policies.oracle import optimum
from lib.security import check_decision

FIELDS = [name for name, _ in DEVICE_FIELDS]


def util_of(obs, i: int) -> float:
    """Device i's utilisation as the observation shows it."""
    return float(obs["devices"][i, FIELDS.index("util")])


def action(shares, mode=1, path=0, block=2, chunks=0):
    s = np.zeros(SLOTS, dtype=np.float32)
    s[:len(shares)] = shares
    return {"shares": s, "block": block, "mode": mode, "comm_path": path,
            "chunks": chunks}


def step(env, act):
    """One step; in task mode (the episode ends) the next episode begins."""
    obs, reward, terminated, truncated, info = env.step(act)
    if terminated:
        obs, _ = env.reset()
    return obs, reward, terminated, truncated, info


# --------------------------------------------------------------------------
# Registration and the Gymnasium checker

def test_make_registers_the_environment():
    env = gymnasium.make(env_pkg.ENV_ID, mode="stream", machine="hetero-4")
    assert isinstance(env.unwrapped, SplitEnv)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)


@pytest.mark.parametrize("overrides", [
    {"mode": "task", "p_busy": 0.3, "p_unhealthy": 0.2},
    {"mode": "stream", "p_busy": 0.3},
    {"mode": "task", "machine": None, "stage": "catalog"},
    {"mode": "stream", "machine": "uni-server-1gpu"},
])
def test_check_env_passes(overrides):
    env = gymnasium.make(env_pkg.ENV_ID, **overrides)
    check_env(env.unwrapped, skip_render_check=True)


# --------------------------------------------------------------------------
# Eq. (2)

@pytest.mark.parametrize("mode", ["task", "stream"])
@pytest.mark.parametrize("machine", ["hetero-4", "uni-server-1gpu",
                                     "uni-server-2gpu-induced"])
def test_equal_split_action_earns_exactly_zero(mode, machine):
    env = SplitEnv(mode=mode, machine=machine, p_busy=0.4, load=2.0)
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(0)
    for i in range(12):
        # mix in random decisions so stream mode has a backlog to share
        act = equal_split_action(obs) if i % 2 == 0 \
            else sample_masked_action(rng, obs)
        obs, reward, _, _, info = step(env, act)
        if i % 2 == 0:
            assert info["accepted"]
            assert abs(reward) <= 1e-12
            assert info["T_decision"] == info["T_equal"]


@pytest.mark.parametrize("task", [
    TaskSpec("matmul", {"M": 16384, "N": 8192, "K": 8192}),
    TaskSpec("reduce", {"N": 1 << 28}),
    TaskSpec("stencil", {"H": 8192, "W": 8192, "T": 8}),
    TaskSpec("histogram", {"N": 1 << 26, "B": 256}, dtype="fp16"),
])
def test_optimum_beats_equal_and_proportional(task):
    env = SplitEnv(machine="hetero-4", tasks=(task,), with_optimum=True)
    env.reset(seed=0)
    machine, snap = env.machine, env.telemetry
    opt = optimum(task, machine, snap)
    prop = ProportionalToPeak().decide(task, machine, snap).with_hash(task)
    _, r_opt, _, _, info = env.step_decision(opt.decision)
    assert info["T_decision"] == info["T_opt"] == opt.total
    env.reset(seed=0)
    _, r_prop, _, _, _ = env.step_decision(prop)
    assert r_opt >= 0.0
    assert r_opt >= r_prop
    assert r_opt == pytest.approx(math.log(info["T_equal"] / opt.total), rel=1e-12)
    # the same decisions as actions rank the same way
    env.reset(seed=0)
    _, r_opt_act, _, _, _ = env.step(action_from_decision(task, opt.decision))
    env.reset(seed=0)
    _, r_prop_act, _, _, _ = env.step(action_from_decision(task, prop))
    assert r_opt_act >= 0.0 and r_opt_act >= r_prop_act - 1e-9
    # the action snaps the chunk count to the policy's grid: within 2 %
    assert r_opt_act == pytest.approx(r_opt, abs=0.02)


# --------------------------------------------------------------------------
# Gate 1: refused decisions are penalised and never executed

class SpyBackend(ModelBackend):
    """The model backend, recording every decision it runs."""

    def __init__(self, machine, **options):
        super().__init__(machine, **options)
        self.ran: list[Decision] = []

    def run(self, task, decision, *, verify=False):
        self.ran.append(decision)
        return super().run(task, decision, verify=verify)


BIG = TaskSpec("reduce", {"N": 2_000_000_000}, dtype="fp64")   # 16 GB


@pytest.mark.parametrize("bad, check", [
    (action([0, 0, 0, 0]), "form.size"),                              # no device
    (action([1, 1, 1, 1], block=len(BLOCKS)), "form.size"),           # block 0
    (action([1, 1, 1, 1], mode=7), "contract.mode"),                  # no mode 7
    (action([1, np.nan, 1, 1]), "form.size"),                         # NaN weight
])
def test_refused_decision_is_penalised_and_never_run(bad, check):
    env = SplitEnv(machine="hetero-4", tasks=(BIG,), penalty=1.5)
    env.reset(seed=0)
    spy = SpyBackend(env.machine)
    env.backend = spy
    _, reward, terminated, _, info = env.step(bad)
    assert reward == -1.5 and terminated
    assert not info["accepted"] and check in info["gate1_checks"]
    assert info["T_decision"] is None
    assert spy.ran == []
    env.reset()
    _, reward, _, _, info = env.step(action([4, 3, 2, 1]))
    assert info["accepted"] and len(spy.ran) == 1
    assert spy.ran[0] == info["decision"]


@pytest.mark.parametrize("act, check", [
    (action([1, 0, 0, 1], mode=1, path=1), "feasibility.p2p"),       # 0-3: no link
    (action([0, 0, 0, 1], mode=0), "feasibility.memory"),             # T4 alone
    (action([1, 0, 0, 0], mode=0, path=2), "feasibility.nccl"),       # nccl, 1 GPU
])
def test_local_rules_are_masked_not_refused(act, check):
    """What Gate 1 would refuse by a local rule the masks turn into a decision
    it accepts: the host path for p2p without links and for one device,
    memory spread over devices that hold it."""
    assert workload(BIG).total_work(BIG).footprint > 16e9 * 0.9    # T4 holds less
    env = SplitEnv(machine="hetero-4", tasks=(BIG,))
    env.reset(seed=0)
    _, _, _, _, info = env.step(act)
    assert info["accepted"], info["gate1"]
    d = info["decision"]
    if check == "feasibility.memory":
        assert d.gpus != (3,) and 3 in d.gpus   # the T4 takes what it holds
    else:
        assert d.comm_path == "host"
    # without the masks the same action is refused by that very rule
    bare = decision_from_weights_row(BIG, act["shares"][:4], act["block"],
                                     act["mode"], act["comm_path"], act["chunks"])
    assert check in check_decision(bare, BIG, env.machine).checks


# --------------------------------------------------------------------------
# Masks

def test_masks_on_one_gpu_forbid_multi_device():
    task = TaskSpec("reduce", {"N": 1 << 24})
    env = SplitEnv(machine="uni-server-1gpu", tasks=(task,))
    obs, _ = env.reset(seed=0)
    assert obs["device_mask"].tolist() == [1] + [0] * (SLOTS - 1)
    assert obs["mode_mask"].tolist() == [1, 0, 1]      # single, pipelined
    assert obs["path_mask"].tolist() == [1, 0, 0]      # no p2p, no nccl
    # weight on absent slots is dropped: the decision is single on device 0
    _, _, _, _, info = step(env, action([0.2, 1, 1, 1, 1, 1, 1, 1]))
    assert info["decision"].gpus == (0,) and info["decision"].mode == "single"
    # nccl with one device: the host path, accepted
    _, reward, _, _, info = step(env, action([1], path=2))
    assert info["accepted"] and info["decision"].comm_path == "host"


def test_masks_on_hetero4_follow_merge_and_topology():
    for task, path in ((TaskSpec("reduce", {"N": 1 << 24}), [1, 1, 1]),
                       (TaskSpec("matmul", {"M": 512, "N": 512, "K": 512}),
                        [1, 0, 0])):
        obs, _ = SplitEnv(machine="hetero-4", tasks=(task,)).reset(seed=0)
        assert obs["device_mask"].tolist() == [1, 1, 1, 1] + [0] * (SLOTS - 4)
        assert obs["mode_mask"].tolist() == [1, 1, 1]
        assert obs["path_mask"].tolist() == path


def test_unhealthy_devices_are_masked_and_unused():
    env = SplitEnv(machine="hetero-4", p_unhealthy=0.5)
    obs, _ = env.reset(seed=2)
    seen_down = False
    for _ in range(30):
        down = [i for i in range(4) if not env.telemetry.healthy[i]]
        assert [obs["device_mask"][i] for i in down] == [0] * len(down)
        seen_down |= bool(down)
        obs, _, _, _, info = step(env, action([1, 1, 1, 1]))
        assert info["accepted"] and not set(info["decision"].gpus) & set(down)
    assert seen_down


def test_single_mode_keeps_the_largest_share():
    w = project_shares(np.array([[0.2, 0.9, 0.5, 0, 0, 0, 0, 0.7]]),
                       np.array([[1, 1, 1, 1, 0, 0, 0, 0]]), np.array([SINGLE]),
                       1e-3)
    assert w.tolist() == [[0, 0.9, 0, 0, 0, 0, 0, 0]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32),
                min_size=8, max_size=8),
       st.lists(st.booleans(), min_size=8, max_size=8),
       st.integers(0, 2))
def test_projection_is_non_negative_finite_and_masked(shares, usable, mode):
    w = project_shares(np.array([shares]), np.array([usable]), np.array([mode]),
                       1e-3)[0]
    assert np.all(np.isfinite(w)) and np.all(w >= 0)
    assert np.all(w[~np.array(usable)] == 0)
    if mode == SINGLE:
        assert np.count_nonzero(w) <= 1


_SHARE = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(0, 1e-6), st.just(0.0), st.just(-0.0),
                   st.floats(1e-300, 1e300))


@settings(max_examples=300, deadline=None)
@given(st.lists(_SHARE, min_size=8, max_size=8),
       st.lists(st.sampled_from([0, 1, 2, -1]), min_size=8, max_size=8),
       st.integers(0, 2), st.sampled_from([0.0, 1e-3, 1e-2, 0.125, 0.5, 1.0]))
def test_one_row_projection_is_the_batch_projection_bit_for_bit(shares, usable,
                                                                 mode, min_share):
    batch = project_shares(np.array([shares]), np.array([usable]),
                           np.array([mode]), min_share)[0]
    row = project_share_row(shares, usable, mode, min_share)
    assert np.array_equal(np.array(row), batch)


def test_one_row_projection_keeps_the_boundary_where_the_batch_does():
    # weights whose share sits on min_share: the sum's rounding decides
    rng = np.random.default_rng(3)
    for _ in range(2000):
        shares = rng.random(8) * 10.0 ** rng.integers(-8, 8, 8)
        shares[rng.random(8) < 0.3] = 0.0
        total = float(project_shares(shares[None], np.ones((1, 8)), np.array([1]),
                                     0.0)[0].sum())
        min_share = float(shares[int(rng.integers(8))]) / total
        batch = project_shares(shares[None], np.ones((1, 8)), np.array([1]),
                               min_share)[0]
        row = project_share_row(shares, [1] * 8, 1, min_share)
        assert row == batch.tolist()


def test_unhashed_row_decision_is_the_hashed_one_without_the_hash():
    rng = np.random.default_rng(5)
    task = TaskSpec("reduce", {"N": 10_000_019})
    for _ in range(300):
        w = rng.random(8) * (rng.random(8) < 0.6)
        args = (w, int(rng.integers(-1, 6)), int(rng.integers(-1, 4)),
                int(rng.integers(-1, 4)), int(rng.integers(-1, 7)))
        hashed = decision_from_weights_row(task, *args)
        plain = decision_from_weights_row(task, *args, hashed=False)
        assert plain.config_hash == "" and plain.with_hash(task) == hashed
        assert decision_from_weights_row(task, w.tolist(), *args[1:]) == hashed


# --------------------------------------------------------------------------
# Seeding

@pytest.mark.parametrize("overrides", [{}, {"machine": None, "stage": "busy"},
                                       {"mode": "stream", "p_busy": 0.4}])
def test_seeded_reset_reproduces(overrides):
    a, b = SplitEnv(**overrides), SplitEnv(**overrides)
    oa, ia = a.reset(seed=11)
    ob, ib = b.reset(seed=11)
    assert all(np.array_equal(oa[k], ob[k]) for k in oa)
    assert ia["task"] == ib["task"] and ia["machine"] == ib["machine"]
    rng_a, rng_b = np.random.default_rng(0), np.random.default_rng(0)
    for _ in range(5):
        oa, ra, *_ = step(a, sample_masked_action(rng_a, oa))
        ob, rb, *_ = step(b, sample_masked_action(rng_b, ob))
        assert ra == rb and all(np.array_equal(oa[k], ob[k]) for k in oa)
    oc, _ = a.reset(seed=12)
    od, _ = a.reset(seed=11)
    assert not np.array_equal(oc["task"], od["task"])


# --------------------------------------------------------------------------
# Stream mode

def test_stream_long_decision_keeps_its_device_busy():
    task = TaskSpec("matmul", {"M": 16384, "N": 8192, "K": 8192})
    env = SplitEnv(mode="stream", machine="hetero-4", tasks=(task,), p_busy=0.0,
                   load=0.8)
    obs, _ = env.reset(seed=0)
    assert [util_of(obs, i) for i in range(4)] == [0.0] * 4
    # everything on the T4: about 4x the equal split's time on one device
    obs, _, _, _, info = env.step(action([0, 0, 0, 1], mode=0))
    assert info["accepted"] and info["T_decision"] > 3 * info["T_equal"]
    assert env.backlog[3] > 0 and list(env.backlog[:3]) == [0.0] * 3
    assert util_of(obs, 3) > 0.5
    assert [util_of(obs, i) for i in range(3)] == [0.0] * 3
    # the next task's times include the queue on device 3
    solo = env._equal_pred.total
    _, reward, _, _, info = env.step(equal_split_action(obs))
    assert info["T_equal"] > solo and reward == 0.0
    assert info["backlog"][3] > 0


def test_stream_reward_prefers_avoiding_the_queue():
    task = TaskSpec("reduce", {"N": 1 << 28})
    env = SplitEnv(mode="stream", machine="hetero-4", tasks=(task,), load=4.0)
    env.reset(seed=0)
    env.step(action([0, 0, 0, 1], mode=0))
    assert env.backlog[3] > 0
    # with the T4 queued, leaving it out beats the equal split
    _, reward, _, _, _ = env.step(action([1, 1, 1, 0]))
    assert reward > 0.0


def test_stream_arrivals_do_not_depend_on_actions():
    a = SplitEnv(mode="stream", p_busy=0.3)
    b = SplitEnv(mode="stream", p_busy=0.3)
    oa, _ = a.reset(seed=4)
    ob, _ = b.reset(seed=4)
    for _ in range(8):
        oa, *_ = a.step(equal_split_action(oa))
        ob, *_ = b.step(action([0, 0, 0, 0, 0, 0, 0, 0]))   # refused: no device
        assert a.now == b.now and a.task == b.task


# --------------------------------------------------------------------------
# Curriculum

def test_held_out_machines_never_appear_in_training():
    cur = Curriculum(seed=3)
    rng = np.random.default_rng(0)
    held = cur.held_out_machines(16)
    assert all({d.name for d in m.devices} & set(HELD_OUT_MODELS) for m in held)
    assert held[0].n >= 12       # the transfer test's large machine
    assert any(t in held[0].name for t in HELD_OUT_TOPOLOGIES)
    for i in range(400):
        stage = cur.stages[i % len(cur.stages)]
        m = sample_machine(rng, stage)
        models = {d.name for d in m.devices}
        assert not models & set(HELD_OUT_MODELS), (stage.name, m.name)
        assert not any(t in m.name for t in HELD_OUT_TOPOLOGIES), m.name
        lo, hi = stage.devices
        assert 1 <= m.n <= hi and (m.n >= lo or stage.machines == "shipped")
        if stage.machines == "identical":
            assert len(models) == 1
    assert [m.name for m in held_out_machines(3, 4)] == \
        [m.name for m in Curriculum(seed=3).held_out_machines(4)]


def test_the_curriculum_covers_the_catalog():
    """1 to 16 devices; identical, induced, mixed, shipped and CPU machines;
    NVSwitch and PCIe-only boxes; idle and loaded states."""
    rng = np.random.default_rng(1)
    stage = Curriculum().stage("catalog")
    counts, names, induced, kinds = set(), set(), False, set()
    for _ in range(600):
        m = sample_machine(rng, stage)
        counts.add(m.n)
        names.add(m.name.split("gpu-", 1)[1] if m.name.startswith("catalog-")
                  else m.name)
        induced |= m.induced
        kinds |= {d.kind for d in m.devices}
        if len({d.name for d in m.devices}) == 1 and m.n > 1 and "nvswitch" in \
                m.name:
            assert len(m.peers) == m.n * (m.n - 1) // 2 or m.devices[0].name in (
                "T4", "A10", "RTX 4090")
    assert {1, 2, 4, 8, 12, 16} <= counts and max(counts) == 16
    assert {"nvswitch", "pcie-p2p", "host-only"} <= names
    assert {"hetero-4", "uni-server-1gpu", "uni-server-2gpu-induced",
            "local-cpu"} <= names
    assert induced and kinds == {"gpu", "cpu"}
    env = SplitEnv(machine=None, stage="catalog")
    loads = []
    for seed in range(30):
        env.reset(seed=seed)
        loads.append(sum(u > 0 for u in env.telemetry.utilisation))
    assert 0 in loads and max(loads) >= 2     # idle, and several loaded


def test_curriculum_goes_easy_to_hard():
    cur = Curriculum()
    names = [s.name for s in cur.stages]
    assert names[0] == "identical" and names[-1] == "catalog"
    assert cur.stage_at(0).name == "identical"
    assert cur.stage_at(cur.total_steps + 5).name == "catalog"
    assert cur.stages[0].log10_bytes[0] > cur.stages[2].log10_bytes[0]
    assert cur.stages[0].p_busy == 0 < cur.stages[3].p_busy
    assert cur.stages[-1].devices == (1, 16)
    with pytest.raises(ValueError, match="held-out"):
        Curriculum(stages=(cur.held_out,))


def test_sampled_tasks_fit_and_span_orders_of_magnitude():
    rng = np.random.default_rng(0)
    cur = Curriculum()
    sizes, kinds = [], set()
    for _ in range(120):
        machine = sample_machine(rng, cur.stage("catalog"))
        task = sample_task(rng, machine, None, (4.0, 10.0))
        eq = EqualSplit().decide(task, machine).with_hash(task)
        assert check_decision(eq, task, machine).accepted
        sizes.append(workload(task).total_work(task).footprint)
        kinds.add(task.kind)
    assert len(kinds) == 5
    assert np.log10(max(sizes)) - np.log10(min(sizes)) > 4


# --------------------------------------------------------------------------
# Batch

@pytest.mark.parametrize("mode", ["task", "stream"])
def test_batch_matches_single_envs(mode):
    n, seed = 5, 20
    cfg = {"mode": mode, "p_busy": 0.3, "episode_len": 6, "machine": None,
           "stage": "busy"}
    batch = BatchModelEnv(n, **cfg)
    singles = [SplitEnv(**cfg) for _ in range(n)]
    obs_b, _ = batch.reset(seed=seed)
    for i, e in enumerate(singles):
        o, _ = e.reset(seed=seed + i)
        assert all(np.array_equal(o[k], obs_b[k][i]) for k in o)
    rng = np.random.default_rng(1)
    for _ in range(5):
        acts = sample_masked_actions(rng, obs_b)
        obs_b, rew_b, term_b, _, _ = batch.step(acts)
        for i, e in enumerate(singles):
            act = {k: (v[i] if k == "shares" else int(v[i])) for k, v in acts.items()}
            o, r, term, *_ = step(e, act)
            assert r == rew_b[i] and term == term_b[i]
            assert all(np.array_equal(o[k], obs_b[k][i]) for k in o)
    assert batch.observation_space.contains(obs_b)


def test_task_mode_ends_every_episode_and_stream_mode_keeps_its_horizon():
    env = SplitEnv(machine="hetero-4")
    obs, _ = env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step(equal_split_action(obs))
    assert terminated and not truncated
    stream = SplitEnv(machine="hetero-4", mode="stream", episode_len=3)
    obs, _ = stream.reset(seed=0)
    flags = []
    for _ in range(3):
        obs, _, terminated, truncated, _ = stream.step(equal_split_action(obs))
        flags.append((terminated, truncated))
    assert flags == [(False, False), (False, False), (False, True)]


def test_task_mode_keeps_the_machine_for_a_few_episodes():
    env = SplitEnv(machine=None, stage="catalog", machine_episodes=3)
    env.reset(seed=5)
    seen = []
    for _ in range(7):
        seen.append(env.machine)
        env.step(equal_split_action(env._observation()))
        env.reset()
    assert seen[0] is seen[1] is seen[2] and seen[3] is not seen[2]


def test_batch_autoresets():
    batch = BatchModelEnv(3)
    obs, _ = batch.reset(seed=0)
    obs, _, terminated, _, infos = batch.step(sample_masked_actions(
        np.random.default_rng(0), obs))
    assert terminated.all() and all("final_observation" in i for i in infos)
    stream = BatchModelEnv(3, mode="stream", episode_len=2)
    obs, _ = stream.reset(seed=0)
    for i in range(2):
        obs, _, _, truncated, infos = stream.step(sample_masked_actions(
            np.random.default_rng(i), obs))
    assert truncated.all() and all("final_observation" in i for i in infos)


def test_a_batch_may_mix_configurations():
    cfgs = [EnvConfig(machine="uni-server-1gpu"), EnvConfig(machine=None,
                                                            stage="catalog")]
    batch = BatchModelEnv(4, cfgs)
    batch.reset(seed=0)
    assert [e.machine.name for e in batch.envs][::2] == ["uni-server-1gpu"] * 2


# --------------------------------------------------------------------------
# Flat observations, backends, benchmark

def test_flat_observation_round_trips():
    obs, _ = SplitEnv().reset(seed=0)
    back = unflatten_observation(flatten_observation(obs))
    assert all(np.array_equal(back[k], obs[k]) for k in obs)


@pytest.mark.serial
def test_cpu_backend_measures_a_small_step(local_cpu):
    task = TaskSpec("elementwise", {"N": 200_000})
    env = SplitEnv(backend="cpu", machine="local-cpu", tasks=(task,))
    try:
        obs, info = env.reset(seed=0)
        assert info["label"] == "MEASURED (cpu)"
        shares = np.zeros(SLOTS, dtype=np.float32)
        shares[0] = 1.0
        _, reward, _, _, info = env.step(action(shares, mode=0))
    finally:
        env.close()
    assert info["label"] == "MEASURED (cpu)" and info["accepted"]
    assert info["T_decision"] > 0 and info["T_equal"] > 0
    assert reward == pytest.approx(math.log(info["T_equal"] / info["T_decision"]))


def test_cuda_backend_refuses_clearly_without_cuda():
    from lib.execution.cuda import probe

    if probe().usable:
        pytest.skip("CUDA is usable here")
    with pytest.raises(BackendUnavailable, match="cuda backend"):
        SplitEnv(backend="cuda", machine="uni-server-1gpu")


@pytest.mark.parametrize("overrides, match", [
    ({"mode": "stream", "backend": "cpu", "machine": "local-cpu"}, "stream mode"),
    ({"backend": "cpu", "machine": None}, "real machine"),
    ({"backend": "cpu", "machine": "local-cpu", "p_busy": 0.3}, "p_busy=0"),
    ({"mode": "batch"}, "mode 'batch'"),
])
def test_inconsistent_configs_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        SplitEnv(**overrides)


def test_cpu_backend_on_gpu_profile_is_unavailable():
    with pytest.raises(BackendUnavailable, match="non-CPU"):
        SplitEnv(backend="cpu", machine="hetero-4")


def test_smoke_benchmark_prints_figures():
    figures = env_steps_per_second(n_steps=200, batch=16)
    print(f"\nenv steps/s (model backend, PREDICTED): single "
          f"{figures['single_steps_per_s']:.0f}, batch of {figures['batch']} "
          f"{figures['batch_steps_per_s']:.0f}")
    assert figures["single_steps_per_s"] > 0


def test_held_out_machines_run_in_the_env():
    env = SplitEnv(machine=None, stage="catalog")
    for machine in held_out_machines(0, 6):
        obs, info = env.reset(seed=1, options={"machine": machine})
        assert info["machine"] == machine.name
        assert env.observation_space.contains(obs)
        assert obs["device_mask"].sum() == machine.n
        _, reward, _, _, info = env.step(equal_split_action(obs))
        assert env.machine is machine
        assert info["accepted"] and reward == 0.0


def test_step_decision_takes_json_and_garbage():
    env = SplitEnv(machine="hetero-4")
    env.reset(seed=0)
    good = env.equal.to_json()
    _, reward, _, _, info = env.step_decision(good)
    assert reward == 0.0 and isinstance(info["decision"], Decision)
    env.reset()
    _, reward, _, _, info = env.step_decision("not json {")
    assert reward == -1.0 and info["gate1_checks"] == ("form.json",)
