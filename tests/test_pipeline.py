"""Training pipeline and the learned policy: stages, checkpoints, resume, the
shipped policy's quality (one policy for every machine), the ablations."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import numpy as np
import pytest

from lib.contract import KINDS, TaskSpec
from lib.costmodel import default_params, predict
from lib.env import sample_task
from lib.learners.ppo import PolicyFormatError, PPOAgent
from lib.platform.machines import load_machine
from lib.platform.telemetry import SimulatedTelemetry
from lib.policies.actions import SLOTS, action_from_decision, decision_from_action
from lib.policies.learned import (
    DEFAULT_POLICY,
    LearnedPolicy,
    ObservationEncoder,
    load_policy,
)
from lib.policies.observation import (
    DEVICE_FEATURES,
    DEVICE_FIELDS,
    TASK_FEATURES,
    TASK_FIELDS,
)
from lib.policies.oracle import optimum
from lib.scoring import evaluate_policy, held_out_tasks
from lib.security import check_decision
from lib.training import (
    TrainConfig,
    imitation_labels,
    make_learner,
    train,
)

#: Pins of the shipped lib/policies/catalog.npz on hetero-4's 40 held-out tasks
#: (seed 2024, PREDICTED, model backend), so a worse file fails. The
#: quick-budget policy (stage 1a imitation over the catalog, then PPO) reaches
#: T_rl/T_opt = 1.022 here, within the design's T2 (<= 1.05), and 2.45x over
#: equal split (T1: >= 1.25x).
SHIPPED_MAX_RL_OVER_OPT = 1.03
SHIPPED_MIN_SPEEDUP_VS_EQUAL = 2.35
T2_MAX_RL_OVER_OPT = 1.05
T1_MIN_SPEEDUP_VS_EQUAL = 1.25


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    return train(TrainConfig(budget="smoke", seed=3), out, progress=False,
                 resume=False)


def test_smoke_training_runs_every_stage_that_applies(smoke_run):
    stages = {s.name: s for s in smoke_run.stages}
    assert stages["cost-model"].status == "ran"
    assert stages["calibrated"].status == "ran"
    assert stages["cost-model"].iterations == 7  # 5 curriculum + 2 target
    out = smoke_run.out_dir
    assert (out / "checkpoint.npz").is_file()
    assert (out / "policy.npz").is_file()
    with (out / "curves" / "cost-model.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 7
    assert {"reward", "env_steps", "phase", "entropy"} <= set(rows[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluation"]["label"] == "PREDICTED (model)"


def test_smoke_stage1a_imitates_before_ppo(smoke_run):
    rows = smoke_run.curves["imitation"]
    labels, steps = smoke_run.config.imitation_plan
    assert labels > 0 and steps > 0
    assert rows[-1]["step"] == steps and rows[-1]["labels"] == labels
    with (smoke_run.out_dir / "curves" / "imitation.csv").open() as fh:
        assert {"share_ce", "share_error", "choice_accuracy", "excluded_ok"} <= set(
            next(csv.DictReader(fh)))
    # the labels stay with the run: PPO's demonstrations, on a resume too
    assert (smoke_run.out_dir / "imitation.npz").is_file()
    assert smoke_run.policy.learner._demos is not None


def test_imitation_labels_are_the_optimum_as_legal_actions(hetero4):
    cfg = TrainConfig(curriculum=False)
    labels = imitation_labels(cfg, hetero4, 24)
    assert labels["obs"].shape == (24, TASK_FEATURES + 4 * DEVICE_FEATURES)
    assert labels["device_mask"].shape == (24, 4)
    np.testing.assert_allclose(labels["shares"].sum(axis=1), 1.0, rtol=1e-12)
    # the optimum's shares, devices it leaves out at exactly 0, never an
    # unusable device
    assert np.all(labels["shares"][~labels["device_mask"]] == 0)
    assert (labels["shares"] == 0).any()
    for h, mask in enumerate(labels["discrete_masks"]):
        if mask is not None:
            assert mask[np.arange(24), labels["choices"][:, h]].all()
    # the chunk count counts only where the optimum pipelines
    pipelined = labels["choices"][:, 1] == 2
    assert np.array_equal(labels["choice_weights"][:, 3] > 0, pipelined)
    # The optimum's reward log(T_eq / T_opt) is never negative.
    assert np.all(labels["returns"] >= -1e-12) and labels["returns"].max() > 0.1


def test_imitation_labels_cover_the_catalog(hetero4):
    labels = imitation_labels(TrainConfig(), hetero4, 60)
    counts = labels["device_mask"].sum(axis=1)
    assert counts.min() == 1 and labels["device_mask"].shape[1] > 4


def test_optimum_survives_the_trip_through_the_action(hetero4):
    rng = np.random.default_rng(5)
    params = default_params()
    for _ in range(30):
        task = sample_task(rng, hetero4)
        best = optimum(task, hetero4, None, params)
        action = action_from_decision(task, best.decision)
        again = decision_from_action(action, task, hetero4)
        assert again.mode == best.decision.mode
        assert again.gpus == best.decision.gpus
        t = predict(task, again, hetero4, None, params).total
        # the chunk count snaps to the policy's grid of counts
        assert t == pytest.approx(best.total, rel=3e-2), task.describe()
        if best.decision.mode != "pipelined":
            assert t == pytest.approx(best.total, rel=1e-9)


def test_imitation_can_be_switched_off(tmp_path):
    cfg = TrainConfig(budget="smoke", seed=1, stages=("cost-model",),
                      imitation_steps=0)
    result = train(cfg, tmp_path, progress=False, evaluate_policy=False)
    assert cfg.imitation_plan[1] == 0
    assert result.curves["imitation"] == []
    assert len(result.curves["cost-model"]) == 7


def test_stage3_skipped_on_a_simulated_machine_with_the_reason(smoke_run):
    measured = {s.name: s for s in smoke_run.stages}["measured"]
    assert measured.status == "skipped"
    assert "simulated" in measured.reason and "hetero-4" in measured.reason


def test_evaluation_reports_the_three_references(smoke_run):
    ev = smoke_run.evaluation
    geo = ev["geo_seconds"]
    assert set(geo) == {"rl", "equal", "proportional-peak", "optimum"}
    # The exhaustive optimum is never slower than the static baselines.
    assert geo["optimum"] <= geo["equal"] and geo["optimum"] <= geo["proportional-peak"]
    assert ev["rl_over_opt"] == pytest.approx(geo["rl"] / geo["optimum"])


def test_resume_after_interruption_ends_identical(tmp_path):
    cfg = TrainConfig(budget="smoke", seed=5, stages=("cost-model",),
                      checkpoint_every=100)
    full = train(cfg, tmp_path / "full", progress=False, evaluate_policy=False)

    calls = []

    def stop_after_three(phase, done, row):
        calls.append(phase)
        return len(calls) == 3

    part = train(cfg, tmp_path / "part", progress=False, callback=stop_after_three,
                 evaluate_policy=False)
    assert part.interrupted and len(part.curves["cost-model"]) == 3
    rest = train(cfg, tmp_path / "part", progress=False, evaluate_policy=False)
    assert not rest.interrupted
    assert [r["iteration"] for r in rest.curves["cost-model"]] == \
        [r["iteration"] for r in full.curves["cost-model"]]
    assert [r["reward"] for r in rest.curves["cost-model"]] == \
        [r["reward"] for r in full.curves["cost-model"]]
    for k, v in full.policy.learner.params.items():
        np.testing.assert_array_equal(rest.policy.learner.params[k], v)


@pytest.mark.serial
def test_measured_stage_on_local_cpu(tmp_path):
    cfg = TrainConfig(machine="local-cpu", budget="smoke", seed=0,
                      stages=("measured",))
    result = train(cfg, tmp_path, progress=False, evaluate_policy=False)
    measured = {s.name: s for s in result.stages}["measured"]
    assert measured.status == "ran", measured.reason
    assert measured.label == "MEASURED (cpu)"
    assert len(result.curves["measured"]) >= 1
    assert np.isfinite(result.curves["measured"][0]["reward"])


def test_shipped_policy_decisions_pass_gate1_for_every_kind(hetero4):
    policy = load_policy()
    assert policy.name == "rl-ppo"
    rng = np.random.default_rng(11)
    sim = SimulatedTelemetry(hetero4, seed=2, p_busy=0.4)
    for kind in KINDS:
        for lo, hi in ((4.0, 6.0), (6.0, 8.0), (8.0, 10.0)):
            for telemetry in (None, sim.step()):
                task = sample_task(rng, hetero4, telemetry, (lo, hi), kinds=[kind])
                decision = policy.decide(task, hetero4, telemetry)
                assert decision.config_hash == ""
                verdict = check_decision(decision.with_hash(task), task, hetero4,
                                         telemetry)
                assert verdict.accepted, (task.describe(), verdict.summary())


def test_shipped_policy_meets_the_acceptance_target(hetero4):
    ev = evaluate_policy(load_policy(), hetero4,
                         held_out_tasks(hetero4, 40, seed=2024))
    assert ev["refused"] == 0
    assert ev["rl_over_opt"] <= SHIPPED_MAX_RL_OVER_OPT <= T2_MAX_RL_OVER_OPT, \
        ev["rl_over_opt"]
    assert ev["speedup_vs_equal"] >= SHIPPED_MIN_SPEEDUP_VS_EQUAL \
        >= T1_MIN_SPEEDUP_VS_EQUAL


def test_shipped_policy_file_is_small_and_summarised():
    assert DEFAULT_POLICY.name == "catalog.npz"
    assert DEFAULT_POLICY.stat().st_size < 2 * 1024 * 1024
    meta = json.loads(DEFAULT_POLICY.with_suffix(".json").read_text())
    assert meta["budget"] == "quick" and meta["config"]["curriculum"]
    assert meta["evaluation"]["label"] == "PREDICTED (model)"


def test_policy_for_another_spec_is_refused_in_one_line(tmp_path):
    agent = make_learner(TrainConfig(hidden=(8, 8, 8)))
    path = agent.save(tmp_path / "old.npz", {"spec": {"state_version": 0}})
    with pytest.raises(PolicyFormatError) as info:
        load_policy(path)
    message = str(info.value)
    assert "\n" not in message and "state version 0" in message
    with pytest.raises(PolicyFormatError, match="does not exist"):
        load_policy(tmp_path / "missing.npz")


def test_an_eight_slot_policy_of_state_version_1_is_refused_in_one_line(tmp_path):
    """The policy files of the eight-slot layout (the former shipped
    hetero-4.npz) are refused by load, with a line that says why."""
    old = PPOAgent(8, 8, [5, 3, 3, 6])
    path = old.save(tmp_path / "hetero-4.npz", {"spec": {"state_version": 1}})
    with pytest.raises(PolicyFormatError) as info:
        load_policy(path)
    message = str(info.value)
    assert "\n" not in message
    assert "state version 1" in message and "retrain" in message


@pytest.mark.parametrize("features,dropped", [
    ("no-telemetry", {"util", "free_frac", "set.mean_util"}),
    ("no-topology", {"log_host_bw", "log_host_lat", "peer_frac", "log_peer_bw",
                     "nvlink_frac", "set.p2p_pairs"}),
])
def test_feature_ablation_zeroes_exactly_the_named_entries(features, dropped):
    rng = np.random.default_rng(0)
    obs = {"task": rng.uniform(0.5, 1.0, TASK_FEATURES),
           "devices": rng.uniform(0.5, 1.0, (SLOTS, DEVICE_FEATURES)),
           "device_mask": np.r_[np.ones(3), np.zeros(SLOTS - 3)].astype(np.int8),
           "mode_mask": np.ones(3, np.int8), "path_mask": np.ones(3, np.int8),
           "block_mask": np.ones(5, np.int8)}
    flat = ObservationEncoder(features).flat(obs)
    assert flat.shape == (TASK_FEATURES + 3 * DEVICE_FEATURES,)
    names = [n for n, _ in TASK_FIELDS] + [
        f"dev{i}.{n}" for i in range(3) for n, _ in DEVICE_FIELDS]
    zeroed = {names[i] for i in np.flatnonzero(flat == 0)}
    assert zeroed == {n for n in names if n.split(".", 1)[-1] in dropped
                      or n in dropped}
    assert len(zeroed) == sum(1 for n in dropped if n.startswith("set.")) + 3 * sum(
        1 for n in dropped if not n.startswith("set."))


def test_policy_state_matches_the_environment(hetero4):
    from lib.env import SplitEnv

    env = SplitEnv(machine="hetero-4", p_busy=0.4)
    obs, _ = env.reset(seed=1)
    policy = LearnedPolicy(make_learner(TrainConfig()))
    task_row, rows, index = policy.state(env.task, env.machine, env.telemetry)
    np.testing.assert_allclose(task_row, obs["task"], atol=1e-6)
    np.testing.assert_allclose(rows, obs["devices"][index], atol=1e-5)
    env.close()


def test_without_the_mask_the_policy_can_pick_what_gate1_refuses(hetero4):
    machine = replace(hetero4, nccl=False)
    task = TaskSpec("reduce", {"N": 1 << 20}, "fp32")
    agent = make_learner(TrainConfig())
    bias = agent.actor.params["by"]
    mode_s, path_s = agent._slices[1], agent._slices[2]
    bias[mode_s] = [0.0, 20.0, 0.0]      # split
    bias[path_s] = [5.0, 0.0, 20.0]      # nccl (this machine lacks it), else host
    masked = LearnedPolicy(agent).decide(task, machine)
    unmasked = LearnedPolicy(agent, use_mask=False).decide(task, machine)
    assert masked.comm_path == "host"
    assert check_decision(masked.with_hash(task), task, machine).accepted
    assert unmasked.comm_path == "nccl"
    assert not check_decision(unmasked.with_hash(task), task, machine).accepted


def test_held_out_tasks_are_fixed_by_their_seed(hetero4):
    a = held_out_tasks(hetero4, 5, seed=1)
    assert a == held_out_tasks(hetero4, 5, seed=1)
    assert a != held_out_tasks(hetero4, 5, seed=2)


def test_pretrain_steps_spread_over_the_parts_in_the_budgets_proportions():
    base = TrainConfig(budget="quick").plan
    plan = TrainConfig(budget="quick", pretrain_steps=10_000).plan
    parts = (*plan.curriculum, plan.target, plan.calibrated)
    assert sum(parts) == 10_000
    before = (*base.curriculum, base.target, base.calibrated)
    for new, old in zip(parts, before, strict=True):
        assert abs(new - 10_000 * old / sum(before)) <= 1
    assert plan.measured == base.measured  # untouched
    assert TrainConfig(budget="quick", finetune_steps=3).plan.measured == 3


@pytest.mark.parametrize("field,value", [("pretrain_steps", -1),
                                         ("finetune_steps", -5),
                                         ("finetune_backend", "model"),
                                         ("finetune_backend", "gpu")])
def test_bad_step_counts_and_backends_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


def test_a_finetune_backend_the_machine_lacks_is_refused_before_training(tmp_path):
    cfg = TrainConfig(machine="local-cpu", budget="smoke", finetune_backend="cuda")
    with pytest.raises(ValueError,
                       match="finetune backend 'cuda'.*local-cpu runs on cpu"):
        train(cfg, tmp_path, progress=False, evaluate_policy=False)
    assert not (tmp_path / "checkpoint.npz").exists()  # nothing was trained


def test_zero_finetune_steps_skip_the_measured_stage_with_the_reason(tmp_path):
    cfg = TrainConfig(machine="local-cpu", budget="smoke", stages=("measured",),
                      finetune_steps=0)
    result = train(cfg, tmp_path, progress=False, evaluate_policy=False)
    measured = {s.name: s for s in result.stages}["measured"]
    assert measured.status == "skipped" and "0 fine-tune steps" in measured.reason


def test_a_profile_of_ones_own_trains_by_its_path(tmp_path):
    """Every stage's environment gets the machine itself, not its name, so a
    profile file (whose name no shipped profile has) trains as a shipped
    one does."""
    path = tmp_path / "my-rack.json"
    path.write_text(json.dumps({"name": "my-rack", "devices": [
        {"catalog": "T4"}, {"catalog": "T4", "scale": 0.5}]}))
    cfg = TrainConfig(machine=str(path), budget="smoke", seed=1,
                      stages=("cost-model",))
    result = train(cfg, tmp_path / "out", progress=False, evaluate_policy=False)
    assert result.curves["cost-model"]
    task = TaskSpec("elementwise", {"N": 1 << 24})
    decision = result.policy.decide(task, load_machine(str(path)))
    assert decision.gpus and abs(sum(decision.shares) - 1.0) < 1e-9
