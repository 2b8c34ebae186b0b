"""The learned policy's single-decision fast path: the same decisions as the
plain computation, bit for bit, and a printed latency benchmark (timings are
printed, never asserted)."""

from __future__ import annotations

import numpy as np
import pytest

from lib.env.curriculum import GPU_CATALOG, random_machine, sample_task
from lib.learners.distributions import concentration_forward
from lib.learners.ppo import PolicyFormatError, PPOAgent, PPOConfig
from lib.platform.machines import load_machine
from lib.platform.telemetry import SimulatedTelemetry, busy, idle
from lib.policies.actions import (
    OBS_KEYS,
    decision_from_weights_row,
    masks,
    project_shares,
)
from lib.policies.learned import (
    FEATURE_SETS,
    HEAD_MASKS,
    HEAD_SIZES,
    OBS_DIM,
    LearnedPolicy,
    load_policy,
)
from lib.policies.observation import STATE_DEVICES, STATE_DIM, encode_state
from lib.runtime import Agent
from lib.scoring import decision_latency


def reference_decide(policy: LearnedPolicy, task, machine, telemetry):
    """``decide`` computed plainly: fresh state and masks, whole-array numpy,
    the batch projection, then the hash dropped."""
    agent, enc = policy.learner, policy.encoder
    m = masks(task, machine, telemetry)
    x = np.concatenate([encode_state(task, machine, telemetry) * enc.keep] + [
        np.asarray(m[k], dtype=np.float64) if enc.use_mask
        else np.ones(m[k].size) for k in OBS_KEYS[1:]])
    h = x
    if agent.config.normalize_obs:
        rms = agent.obs_rms
        h = np.clip((x - rms.mean) / np.sqrt(rms.var + rms.eps), -rms.clip,
                    rms.clip)
    p, last = agent.actor.params, agent.actor.n_layers - 1
    for i in range(last):
        h = h @ p[f"W{i}"] + p[f"b{i}"]
        h = np.tanh(h) if agent.actor.activation == "tanh" else np.maximum(h, 0.0)
    out = h @ p[f"W{last}"] + p[f"b{last}"]
    slices = agent._slices
    alpha = concentration_forward(out[slices[0]], agent.config.alpha_min)
    if enc.use_mask:
        alpha = np.where(m["device_mask"] != 0, alpha, 0.0)
    ch = []
    for s, key in zip(slices[1:], HEAD_MASKS, strict=True):
        logits = out[s]
        if enc.use_mask and key is not None:
            logits = np.where(m[key] != 0, logits, -np.inf)
        ch.append(int(np.argmax(logits)))
    w = project_shares(alpha[None], m["device_mask"][None], np.array([ch[1]]),
                       policy.min_share)[0]
    decision = decision_from_weights_row(task, w, *ch)
    return decision.__class__(**{**decision.__dict__, "config_hash": ""})


def random_agent(seed: int, activation: str) -> PPOAgent:
    """A PPO agent with large random weights and a non-trivial normaliser, so
    that every head and mode gets chosen."""
    agent = PPOAgent(OBS_DIM, STATE_DEVICES, HEAD_SIZES,
                     PPOConfig(hidden=(32, 16), activation=activation, seed=seed))
    rng = np.random.default_rng(seed)
    for key, value in agent.actor.params.items():
        agent.actor.params[key] = value + rng.normal(scale=3.0, size=value.shape)
    agent.obs_rms.mean = rng.normal(size=OBS_DIM)
    agent.obs_rms.var = rng.uniform(0.1, 2.0, size=OBS_DIM)
    return agent


def machines():
    rng = np.random.default_rng(2)
    models = sorted(GPU_CATALOG)
    out = [load_machine("hetero-4")]
    for k in (1, 2, 3, 5, 8):
        out.append(random_machine(rng, list(rng.choice(models, size=k)), f"m{k}"))
    return out


def telemetries(machine, rng):
    sim = SimulatedTelemetry(machine, seed=int(rng.integers(1000)))
    healthy = [bool(h) for h in rng.random(machine.n) < 0.7]
    return [None, idle(machine), sim.step(), sim.step(),
            busy(machine, rng.random(machine.n).tolist(), healthy=healthy)]


def policies():
    out = [LearnedPolicy(random_agent(seed, act), features=f, use_mask=u)
           for seed, act in ((1, "tanh"), (2, "relu"))
           for f in FEATURE_SETS for u in (True, False)]
    try:
        out.append(load_policy())
    except PolicyFormatError:
        pass
    return out


def test_fast_decide_is_the_plain_computation_bit_for_bit():
    rng = np.random.default_rng(0)
    modes = set()
    pols = policies()
    for machine in machines():
        for telemetry in telemetries(machine, rng):
            try:
                tasks = [sample_task(rng, machine, telemetry) for _ in range(8)]
            except ValueError:  # nothing usable under this snapshot
                tasks = [sample_task(rng, machine) for _ in range(8)]
            for policy in pols:
                for task in tasks:
                    fast = policy.decide(task, machine, telemetry)
                    assert fast == reference_decide(policy, task, machine,
                                                     telemetry)
                    modes.add(fast.mode)
    assert modes == {"single", "split", "pipelined"}


def test_the_observation_cache_follows_machine_telemetry_and_task():
    rng = np.random.default_rng(1)
    policy = LearnedPolicy(random_agent(3, "tanh"))
    ms = machines()
    for _ in range(200):  # hop between machines and snapshots at random
        machine = ms[int(rng.integers(len(ms)))]
        telemetry = telemetries(machine, rng)[int(rng.integers(5))]
        task = sample_task(rng, machine)
        x, m = policy.observe(task, machine, telemetry)
        fresh, fresh_masks = LearnedPolicy(policy.learner).observe(task, machine,
                                                                   telemetry)
        assert np.array_equal(x, fresh)
        assert all(np.array_equal(m[k], fresh_masks[k]) for k in fresh_masks)
        assert np.array_equal(x[:STATE_DIM], encode_state(task, machine, telemetry))


def test_shared_masks_are_read_only():
    machine = load_machine("hetero-4")
    policy = LearnedPolicy(random_agent(4, "tanh"))
    task = sample_task(np.random.default_rng(0), machine)
    _, m = policy.observe(task, machine)
    with pytest.raises(ValueError):
        m["device_mask"][0] = 0


def test_one_row_forward_is_the_batch_forward():
    actor = random_agent(5, "relu").actor
    scratch = actor.scratch()
    rng = np.random.default_rng(6)
    for _ in range(200):
        x = rng.normal(size=OBS_DIM)
        assert np.array_equal(actor.forward_one(x, scratch), actor(x[None])[0])
        assert np.array_equal(actor.forward_one(x), actor(x[None])[0])


def test_decision_latency_smoke():
    machine = load_machine("hetero-4")
    agent = Agent(machine=machine)
    tasks = [sample_task(np.random.default_rng(7), machine) for _ in range(100)]
    for task in tasks:  # the runtime path: decide, hash once, Gate 1
        agent.optimize(task)
    figures = decision_latency(agent.policy, machine, tasks, repeats=3)
    print(f"decision latency on hetero-4 ({agent.policy.name}): "
          f"p50 {figures['p50_us']:.0f} us, p99 {figures['p99_us']:.0f} us")
    assert figures["decisions"] == 300
