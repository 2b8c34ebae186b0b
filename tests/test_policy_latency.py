"""The learned policy's single-decision fast path: the decisions of the plain
computation (the batch network on the state), and printed latency benchmarks
(timings are printed, never asserted)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from lib.contract import Decision
from lib.env.curriculum import GPU_CATALOG, random_machine, sample_task
from lib.evaluation.bench import latency_benchmark, latency_machine
from lib.learners.setnet import waterfill_forward
from lib.platform.machines import load_machine
from lib.platform.telemetry import SimulatedTelemetry, busy, idle
from lib.policies import fastpath
from lib.policies.actions import (
    Decoder,
    decision_from_weights_row,
    project_share_row,
)
from lib.policies.learned import (
    FEATURE_SETS,
    HEAD_MASKS,
    LearnedPolicy,
    load_policy,
)
from lib.policies.observation import encode_state
from lib.runtime import Agent
from lib.scoring import decision_latency
from lib.security import check_decision
from lib.training import TrainConfig, make_learner


def reference_decide(policy: LearnedPolicy, task, machine, telemetry):
    """``decide`` computed plainly: a fresh state, the batch network
    (:meth:`SetNet.forward`), the batch water-filling, then the decoder."""
    agent, enc = policy.learner, policy.encoder
    decoder = Decoder(machine, telemetry, policy.min_share)
    m = decoder.masks(task, machine.n)
    state = encode_state(task, machine, telemetry)
    usable = [i for i in state.index if m["device_mask"][i] or not enc.use_mask]
    rows = state.devices[[state.index.index(i) for i in usable]] * enc.keep_device
    t = state.task * enc.keep_task
    z, y = agent.actor(t[None], rows[None], np.ones((1, len(usable)), bool))
    ch = []
    for s, key in zip(agent._slices, HEAD_MASKS, strict=True):
        logits = y[0, s]
        if enc.use_mask and key is not None:
            logits = np.where(m[key] != 0, logits, -np.inf)
        ch.append(int(np.argmax(logits)))
    c = 2 * ch[agent.config.share_head]
    s, _ = waterfill_forward(z[:, :, c], z[:, :, c + 1], np.ones((1, len(usable)),
                                                                   bool))
    shares = np.zeros(machine.n)
    shares[usable] = s[0]
    if enc.use_mask:
        return shares, ch, decoder.decide(task, shares, *ch, hashed=False)
    w = project_share_row(shares, decoder.healthy, ch[1], policy.min_share)
    return shares, ch, decision_from_weights_row(task, w, *ch, hashed=False)


def random_policy(seed: int, features: str, use_mask: bool,
                  hidden: tuple[int, int, int] = (64, 64, 64)) -> LearnedPolicy:
    """A set policy with large random weights, so every head and mode gets
    chosen (``hidden``: the set network's widths; a 0 in the middle leaves
    out the item layer after the pool)."""
    agent = make_learner(TrainConfig(seed=seed, hidden=hidden))
    rng = np.random.default_rng(seed)
    for key, value in agent.actor.params.items():
        agent.actor.params[key] = value + rng.normal(scale=1.0, size=value.shape)
    return LearnedPolicy(agent, features=features, use_mask=use_mask)


def machines():
    rng = np.random.default_rng(2)
    models = sorted(GPU_CATALOG)
    out = [load_machine("hetero-4"), load_machine("local-cpu")]
    for k in (1, 2, 3, 5, 8, 16):
        out.append(random_machine(rng, list(rng.choice(models, size=k)), f"m{k}"))
    return out


def telemetries(machine, rng):
    sim = SimulatedTelemetry(machine, seed=int(rng.integers(1000)))
    healthy = [bool(h) for h in rng.random(machine.n) < 0.7]
    healthy[0] = True
    return [None, idle(machine), sim.step(), sim.step(),
            busy(machine, rng.random(machine.n).tolist(), healthy=healthy)]


def test_fast_decide_is_the_plain_computation():
    """Every decision of the fast path is the plain computation's (the same
    devices, mode, path, block and chunk, shares equal to 1e-9), on machines
    of 1 to 16 devices, loaded, with unhealthy devices, every ablation."""
    rng = np.random.default_rng(0)
    modes = set()
    policies = [random_policy(seed, f, u) for seed in (1, 2)
                for f in FEATURE_SETS for u in (True, False)] + [
        load_policy(), random_policy(4, "all", True, (32, 0, 48))]
    for policy in policies:
        for machine in machines():
            for telemetry in telemetries(machine, rng):
                for _ in range(3):
                    task = sample_task(rng, machine, telemetry)
                    fast = policy.decide(task, machine, telemetry)
                    shares, ch = policy.act(task, machine, telemetry)[:2]
                    ref_shares, ref_ch, plain = reference_decide(
                        policy, task, machine, telemetry)
                    assert ch == ref_ch
                    np.testing.assert_allclose(shares, ref_shares, rtol=1e-6,
                                               atol=1e-9)
                    top = np.sort(ref_shares)[-2:] if machine.n > 1 else [0, 1]
                    tie = top[1] - top[0] <= 1e-9 * top[1]  # identical devices
                    if not (tie and plain.mode == "single"):
                        assert (fast.gpus, fast.mode, fast.comm_path, fast.block,
                                fast.chunk) == (plain.gpus, plain.mode,
                                                plain.comm_path, plain.block,
                                                plain.chunk)
                        np.testing.assert_allclose(fast.shares, plain.shares,
                                                   rtol=1e-6, atol=1e-9)
                    modes.add(fast.mode)
    assert modes == {"single", "split", "pipelined"}


def test_the_compiled_tanh_is_the_library_tanh():
    """The kernel's own ``tanh`` (the form that vectorises) is within 1e-14
    of NumPy's from tiny to saturated inputs, odd, 1 beyond 20, and keeps
    NaN."""
    x = np.concatenate([np.linspace(-25.0, 25.0, 100_000),
                        np.logspace(-12, 1.5, 5_000),
                        -np.logspace(-12, 1.5, 5_000)])
    got = np.array([fastpath._tanh(v) for v in x[::7]])
    np.testing.assert_allclose(got, np.tanh(x[::7]), rtol=0, atol=1e-14)
    h = x.reshape(-1, 5).copy()
    fastpath._tanh_all(h)
    np.testing.assert_allclose(h.ravel(), np.tanh(x), rtol=0, atol=1e-14)
    assert fastpath._tanh(np.inf) == 1.0 and fastpath._tanh(-np.inf) == -1.0
    assert fastpath._tanh(30.0) == 1.0 and fastpath._tanh(-30.0) == -1.0
    assert np.isnan(fastpath._tanh(np.nan))


def test_the_compiled_waterfill_is_the_batch_one():
    """:func:`fastpath.waterfill` gives the batch water-filling's shares for
    sets of 1 to 16 present devices, identical devices, devices left out by
    their fixed cost, and clipped extremes."""
    rng = np.random.default_rng(11)
    cases = [(np.zeros(4), np.zeros(4)), (np.array([0.0, 0.0, 5.0]),
                                          np.array([-3.0, -3.0, 4.0])),
             (np.array([800.0, -800.0]), np.array([-900.0, 900.0]))]
    for k in (1, 2, 3, 5, 8, 16):
        for scale in (0.1, 1.0, 5.0):
            cases.append((rng.normal(scale=scale, size=k),
                          rng.normal(scale=scale, size=k)))
    for log_time, log_fixed in cases:
        with np.errstate(over="ignore"):  # the batch one at exp(+-700)
            want, _ = waterfill_forward(log_time[None], log_fixed[None],
                                        np.ones((1, len(log_time)), bool))
        got = fastpath.waterfill(log_time.copy(), log_fixed.copy())
        np.testing.assert_allclose(got, want[0], rtol=1e-12, atol=1e-15)
        assert got.sum() == pytest.approx(1.0)


def test_the_cache_follows_machine_telemetry_task_and_weights():
    policy = random_policy(3, "all", True)
    machine = load_machine("hetero-4")
    rng = np.random.default_rng(1)
    sim = SimulatedTelemetry(machine, seed=4, p_busy=0.6)
    for _ in range(20):
        telemetry = sim.step()
        task = sample_task(rng, machine, telemetry)
        fresh = LearnedPolicy(policy.learner).decide(task, machine, telemetry)
        assert policy.decide(task, machine, telemetry) == fresh
    # changed weights (an optimiser step) are seen at once, the first layer
    # (folded into the cache) included
    tasks = [sample_task(rng, machine) for _ in range(20)]
    before = [policy.decide(t, machine) for t in tasks]
    policy.learner.actor.params["W1"] *= -1.0
    policy.learner.optimizer.t += 1
    after = [policy.decide(t, machine) for t in tasks]
    assert after == [LearnedPolicy(policy.learner).decide(t, machine) for t in tasks]
    assert after != before


def test_the_cached_path_decides_as_an_uncached_policy():
    """One long-lived policy (contexts, folded weights, buffers and the
    decoder's caches reused) against a fresh policy per decision (nothing
    cached), over machines of 1, 4 and 16 devices under every kind of
    snapshot (idle, simulated, busy with unhealthy devices) visited in a
    random interleaving, small tasks and tasks too big for some devices:
    the same decisions exactly; hashes equal to the
    plain JSON encoder's; the same Gate 1 verdicts for a decision that
    remembers its hash and for a fresh copy."""
    rng = np.random.default_rng(5)
    models = sorted(GPU_CATALOG)
    fleet = [random_machine(rng, list(rng.choice(models, size=k)), f"r{k}")
             for k in (1, 4, 16)] + [load_machine("hetero-4"), latency_machine(16)]
    states = [(m, t) for m in fleet for t in telemetries(m, rng)]
    policies = [load_policy(), random_policy(7, "all", True),
                random_policy(8, "no-telemetry", True),
                random_policy(9, "no-topology", False)]
    for policy in policies:
        for _ in range(250):
            machine, telemetry = states[rng.integers(len(states))]
            big = rng.random() < 0.4  # large enough that memory caps bind
            task = sample_task(rng, machine, telemetry,
                               (9.5, 11.5) if big else (4.0, 10.0))
            fresh = LearnedPolicy(policy.learner, features=policy.features,
                                  use_mask=policy.use_mask,
                                  min_share=policy.min_share)
            decision = policy.decide(task, machine, telemetry)
            assert decision == fresh.decide(task, machine, telemetry)
            hashed = decision.with_hash(task)
            text = json.dumps({"task": task.to_json(),
                               "decision": decision.to_json(include_hash=False)},
                              sort_keys=True, separators=(",", ":"))
            assert hashed.config_hash == hashlib.sha256(text.encode()).hexdigest()
            copy = Decision(hashed.gpus, hashed.shares, hashed.chunk, hashed.block,
                            hashed.mode, hashed.comm_path, hashed.config_hash)
            got = check_decision(hashed, task, machine, telemetry)
            want = check_decision(copy, task, machine, telemetry)
            assert (got.accepted, got.violations) == (want.accepted,
                                                      want.violations)


def test_a_remembered_hash_does_not_hide_a_change():
    """Gate 1 refuses a hashed decision whose fields were swapped afterwards
    (the remembered digest is for the old ones), or checked for another
    task."""
    machine = load_machine("hetero-4")
    rng = np.random.default_rng(3)
    policy = load_policy()
    task, other = (sample_task(rng, machine) for _ in range(2))
    decision = policy.decide(task, machine).with_hash(task)
    assert check_decision(decision, task, machine).accepted
    refused = check_decision(decision, other, machine)
    assert "integrity.hash_mismatch" in {v.check for v in refused.violations}
    changed = {"chunk": decision.chunk + 1 if decision.chunk < task.split_size
               else decision.chunk - 1,
               "block": 64 if decision.block != 64 else 128,
               "shares": tuple(reversed(decision.shares)) if len(decision.gpus) > 1
               else (1.0,)}
    for name, value in changed.items():
        tampered = decision.with_hash(task)
        object.__setattr__(tampered, name, value)  # after hashing
        if value == getattr(decision, name):
            continue  # nothing changed (a single share of 1.0)
        verdict = check_decision(tampered, task, machine)
        assert "integrity.hash_mismatch" in {v.check for v in verdict.violations}


def test_decision_latency_smoke():
    machine = load_machine("hetero-4")
    agent = Agent(machine=machine)
    tasks = [sample_task(np.random.default_rng(i), machine) for i in range(60)]
    lat = decision_latency(agent.policy, machine, tasks, repeats=2)
    print(f"\ndecision latency (shipped policy, hetero-4, optimize incl. Gate 1, "
          f"MEASURED on this computer): p50 {lat['p50_us']:.0f} us, "
          f"p99 {lat['p99_us']:.0f} us")
    assert lat["decisions"] == 120 and lat["refused"] == 0


def test_latency_benchmark_prints_its_goals():
    rows = latency_benchmark(tasks=60)
    assert [r["devices"] for r in rows] == [4, 16]
    assert all(r["refused"] == 0 and r["decisions"] == 60 for r in rows)
    assert rows[0]["goal_p50_us"] == 50 and rows[1]["goal_p50_us"] == 100
