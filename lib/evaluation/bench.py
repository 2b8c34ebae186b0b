"""Benchmarks: every figure ``gpuhive bench`` prints, in one place.

Each function measures MEASURED wall clock on this computer and returns the
figures (some also print them). No test asserts on a time: a slow or busy
machine is not a failure. Goals are printed next to the figures.

- :func:`optimum_benchmark` -- the exhaustive optimum's search time (2-8 devices);
- :func:`cache_hit_benchmark` -- a sealed-cache hit (Gate 2b load and verify);
- :func:`env_steps_per_second` -- environment steps, one env and a batch;
- :func:`benchmark_update`, :func:`benchmark_act`, :func:`benchmark_toy` -- the
  set PPO learner's update and act, and a toy problem with a known optimum;
- :func:`latency_benchmark` -- ``optimize`` (decide, hash, Gate 1) of the
  shipped policy on fresh tasks, four and sixteen devices, against its goals
  (one decision's timing is :func:`lib.scoring.decision_latency`);
- :func:`refusal_benchmark` -- decisions sampled over every shipped profile and
  random catalog machines through the masks: how many Gate 1 refuses (the
  masks make it none).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from lib.codegen import CodeGenerator, KernelCache
from lib.contract import Decision, TaskSpec
from lib.env.batch import BatchModelEnv
from lib.env.curriculum import (
    DEFAULT_STAGES,
    SHIPPED_PROFILES,
    sample_machine,
    sample_task,
)
from lib.env.split import EnvConfig, SplitEnv
from lib.learners.ppo import PPOAgent, PPOConfig
from lib.learners.setppo import SetPPOAgent, SetPPOConfig
from lib.learners.toy import SpeedShareProblem, evaluate, train_ppo
from lib.platform.machines import Machine, load_machine, machine_from_json
from lib.platform.telemetry import SimulatedTelemetry, Snapshot, idle
from lib.policies.actions import (
    Decoder,
    observe,
    sample_masked_action,
    sample_masked_actions,
)
from lib.policies.baselines import Policy
from lib.policies.learned import (
    HEAD_SIZES,
    LearnedPolicy,
    ObservationEncoder,
    action_from_choices,
)
from lib.policies.observation import DEVICE_FEATURES, TASK_FEATURES
from lib.policies.oracle import optimum
from lib.policies.registry import default_policy
from lib.scoring import decision_latency, random_tasks
from lib.security import check_decision

#: GPU models of the synthetic machines the benchmark searches over.
BENCH_MODELS = ("H100 SXM", "A100 80GB SXM", "V100 SXM2 32GB", "T4", "L4", "A10",
                "RTX 4090", "H200 SXM")


def optimum_benchmark(device_counts: tuple[int, ...] = (2, 4, 8), repeats: int = 20,
              seed: int = 0) -> list[dict[str, float]]:
    """Time :func:`optimum` on synthetic machines of 2, 4 and 8 different GPUs.

    Each row: device count, median and p90 milliseconds over ``repeats`` searches
    (a matmul, a reduce and a stencil in turn), and candidates priced.
    """
    rng = np.random.default_rng(seed)
    tasks = [TaskSpec("matmul", {"M": 8192, "N": 8192, "K": 8192}),
             TaskSpec("reduce", {"N": 1 << 28}),
             TaskSpec("stencil", {"H": 16384, "W": 16384, "T": 8})]
    rows = []
    for k in device_counts:
        machine = machine_from_json({
            "name": f"bench-{k}", "nccl": True,
            "devices": [{"catalog": BENCH_MODELS[i % len(BENCH_MODELS)]}
                        for i in range(k)],
            "peers": [{"a": i, "b": i + 1, "kind": "nvlink"}
                      for i in range(0, k - 1, 2)]})
        times, cands = [], 0
        optimum(tasks[0], machine)  # warm caches
        for r in range(repeats):
            best = optimum(tasks[int(rng.integers(len(tasks))) if r else 0], machine)
            times.append(best.seconds)
            cands = best.candidates
        rows.append({"devices": k, "median_ms": float(np.median(times)) * 1e3,
                     "p90_ms": float(np.percentile(times, 90)) * 1e3,
                     "candidates": cands})
    return rows


def cache_hit_benchmark(repeats: int = 200, kind: str = "matmul",
                        quiet: bool = False) -> dict[str, float]:
    """Latency of a cache hit (Gate 2b load + verify + building the result).

    Generates one kernel into a temporary ``GPUHIVE_HOME``, then times
    ``repeats`` hits of :meth:`CodeGenerator.generate` and of the bare
    :meth:`KernelCache.get`. Goal: under 1 ms for a typical kernel (printed,
    not asserted).

    Returns:
        ``{"p50_ms", "p90_ms", "mean_ms", "get_p50_ms", "miss_s",
        "entry_bytes", "repeats"}``.
    """
    dims = {"matmul": {"M": 1024, "N": 1024, "K": 1024}}.get(kind, {})
    with tempfile.TemporaryDirectory(prefix="gh_bench_") as tmp:
        home = Path(tmp)
        cache = KernelCache(home / "kernels", home / "keys" / "seal.key")
        gen = CodeGenerator(cache=cache, measure_resources=False)
        task = TaskSpec(kind, dims or {"N": 1 << 20}, "fp32")
        decision = Decision((0,), (1.0,), task.split_size, 256, "single").with_hash(
            task)
        t0 = time.perf_counter()
        first = gen.generate(task, decision)
        miss = time.perf_counter() - t0
        full, bare = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            hit = gen.generate(task, decision)
            full.append(time.perf_counter() - t)
            t = time.perf_counter()
            cache.get(first.cache_key)
            bare.append(time.perf_counter() - t)
        assert hit.cached
        size = cache.path(first.cache_key).stat().st_size
    full.sort()
    result = {
        "p50_ms": 1e3 * statistics.median(full),
        "p90_ms": 1e3 * full[int(0.9 * (len(full) - 1))],
        "mean_ms": 1e3 * statistics.fmean(full),
        "get_p50_ms": 1e3 * statistics.median(bare),
        "miss_s": miss, "entry_bytes": float(size), "repeats": float(repeats),
    }
    if not quiet:
        print(f"cache hit ({kind} fp32, {size} B entry, {repeats} repeats): "
              f"p50 {result['p50_ms']:.3f} ms, p90 {result['p90_ms']:.3f} ms, "
              f"bare get p50 {result['get_p50_ms']:.3f} ms (goal < 1 ms); "
              f"miss {miss:.2f} s")
    return result


def env_steps_per_second(n_steps: int = 2000, batch: int = 64, seed: int = 0,
                         config: EnvConfig | None = None) -> dict[str, float]:
    """Environment steps per second, one env and a batch (model backend).

    Both take random actions that respect the masks, on ``config`` (default:
    task mode on hetero-4). Times include drawing the actions.

    Returns:
        ``single_steps_per_s``, ``batch_steps_per_s`` (environment steps, all
        batch members counted), ``speedup``, ``batch``, ``n_steps``.
    """
    rng = np.random.default_rng(seed)
    env = SplitEnv(config)
    obs, _ = env.reset(seed=seed)
    start = time.perf_counter()
    for _ in range(n_steps):
        obs, _, terminated, truncated, _ = env.step(sample_masked_action(rng, obs))
        if terminated or truncated:
            obs, _ = env.reset()
    single = n_steps / (time.perf_counter() - start)
    env.close()

    benv = BatchModelEnv(batch, config)
    obs, _ = benv.reset(seed=seed)
    rounds = max(1, -(-n_steps // batch))
    start = time.perf_counter()
    for _ in range(rounds):
        obs, *_ = benv.step(sample_masked_actions(rng, obs))
    batched = rounds * batch / (time.perf_counter() - start)
    benv.close()
    return {"single_steps_per_s": single, "batch_steps_per_s": batched,
            "speedup": batched / single, "batch": batch, "n_steps": n_steps}


#: Devices of the sets in the learner benchmarks.
BENCH_DEVICES = 4


def _agent(seed: int) -> SetPPOAgent:
    """A set PPO agent sized for the policy's state and heads."""
    return SetPPOAgent(TASK_FEATURES, DEVICE_FEATURES, HEAD_SIZES,
                       SetPPOConfig(seed=seed, share_head=1))


def _fake_batch(rng: np.random.Generator, agent: SetPPOAgent,
                batch: int) -> dict[str, np.ndarray]:
    n = BENCH_DEVICES
    obs = rng.standard_normal((batch, agent.context_dim + n * agent.item_dim))
    dmask = rng.random((batch, n)) < 0.8
    dmask[:, 0] = True
    cmasks = [np.ones((batch, s), dtype=bool) for s in agent.discrete_sizes]
    out = agent.act_batch(obs, dmask, cmasks, rng)
    return {"obs": obs, "device_mask": dmask, "discrete_masks": cmasks,
            "shares": out.shares, "choices": out.choices, "logp": out.logp,
            "advantages": rng.standard_normal(batch),
            "returns": rng.standard_normal(batch)}


def benchmark_update(batch: int = 2048, repeats: int = 3, seed: int = 0,
                     verbose: bool = True) -> float:
    """Median seconds of one :meth:`SetPPOAgent.update` on ``batch`` rows.

    Default config (4 epochs, minibatch 256), the policy's state and heads,
    sets of :data:`BENCH_DEVICES` devices (a fifth of them masked).
    """
    rng = np.random.default_rng(seed)
    agent = _agent(seed)
    data = _fake_batch(rng, agent, batch)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        agent.update(data)
        times.append(time.perf_counter() - t0)
    out = float(np.median(times))
    if verbose:
        print(f"PPO update, batch {batch}: {out:.3f} s (median of {repeats})")
    return out


def benchmark_act(n: int = 2000, seed: int = 0,
                  verbose: bool = True) -> dict[str, float]:
    """Percentiles of the latency of one deterministic
    :meth:`SetPPOAgent.propose` (the batch path; a policy decides through
    :class:`~lib.policies.learned.LearnedPolicy`'s faster one).

    Returns:
        ``{"p50_us": ..., "p99_us": ...}`` microseconds per decision.
    """
    rng = np.random.default_rng(seed)
    agent = _agent(seed)
    obs = rng.standard_normal((n, agent.context_dim
                               + BENCH_DEVICES * agent.item_dim))
    dmask = np.ones((1, BENCH_DEVICES), dtype=bool)
    lat = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        agent.propose(obs[i], dmask, None)
        lat[i] = time.perf_counter() - t0
    out = {"p50_us": float(np.percentile(lat, 50) * 1e6),
           "p99_us": float(np.percentile(lat, 99) * 1e6)}
    if verbose:
        print(f"set PPO act (batch path): p50 {out['p50_us']:.0f} us, p99 "
              f"{out['p99_us']:.0f} us over {n} decisions")
    return out


#: Latency goals: devices -> (p50, p99) microseconds (None: no p99 goal).
LATENCY_GOALS: dict[int, tuple[float, float | None]] = {4: (50.0, 300.0),
                                                        16: (100.0, None)}
#: GPU models of the benchmark's sixteen-device machine, in turn.
LATENCY_MODELS = ("H100 SXM", "A100 80GB SXM", "V100 SXM2 32GB", "T4")


def latency_machine(devices: int) -> Machine:
    """``hetero-4`` for four devices; else ``devices`` GPUs of
    :data:`LATENCY_MODELS` in turn, NVLink pairs, NCCL (simulated)."""
    if devices == 4:
        return load_machine("hetero-4")
    return machine_from_json({
        "name": f"bench-latency-{devices}", "nccl": True,
        "devices": [{"catalog": LATENCY_MODELS[i % len(LATENCY_MODELS)]}
                    for i in range(devices)],
        "peers": [{"a": i, "b": i + 1, "kind": "nvlink"}
                  for i in range(0, devices - 1, 2)]})


def latency_benchmark(policy: Policy | None = None,
                      device_counts: tuple[int, ...] = (4, 16), tasks: int = 500,
                      seed: int = 0, verbose: bool = True
                      ) -> list[dict[str, Any]]:
    """``optimize`` (decide, hash, Gate 1) of ``policy`` (default: the
    shipped one) on ``tasks`` fresh tasks per machine of
    :func:`latency_machine`, idle, warmed up on 20 others: MEASURED wall
    clock on this computer, printed next to :data:`LATENCY_GOALS`.

    Returns:
        One row per device count: ``devices``, ``p50_us``, ``p99_us``,
        ``mean_us``, ``decisions``, ``refused``, ``goal_p50_us``,
        ``goal_p99_us`` (nan without one), ``met``.
    """
    policy = policy or default_policy()
    rows = []
    for k in device_counts:
        machine = latency_machine(k)
        lat = decision_latency(policy, machine, random_tasks(tasks, seed=seed),
                               states=[idle(machine)],
                               warmup=random_tasks(20, seed=seed + 1))
        p50, p99 = LATENCY_GOALS.get(k, (math.inf, None))
        met = lat["p50_us"] <= p50 and (p99 is None or lat["p99_us"] <= p99)
        rows.append({"devices": k, **lat, "goal_p50_us": p50,
                     "goal_p99_us": math.nan if p99 is None else p99,
                     "met": met})
        if verbose:
            goal = f"p50 <= {p50:.0f} us" + (f", p99 <= {p99:.0f} us"
                                             if p99 is not None else "")
            print(f"decision latency, {k} devices ({machine.name}), optimize "
                  f"incl. hash and Gate 1, {lat['decisions']} fresh tasks, "
                  f"MEASURED: p50 {lat['p50_us']:.0f} us, p99 "
                  f"{lat['p99_us']:.0f} us (goal {goal}: "
                  f"{'met' if met else 'NOT met'})")
    return rows


def _refusal_machines(rng: np.random.Generator, count: int) -> list[Machine]:
    """Every shipped profile, then random catalog machines of 1 to 16
    devices (the curriculum's last stage)."""
    out = [load_machine(n) for n in (*SHIPPED_PROFILES, "local-cpu")]
    while len(out) < count:
        out.append(sample_machine(rng, DEFAULT_STAGES[-1]))
    return out


def refusal_benchmark(decisions: int = 10_000, seed: int = 0,
                      policy: LearnedPolicy | None = None,
                      verbose: bool = True) -> dict[str, Any]:
    """Decisions sampled through the masks, and how many Gate 1 refuses.

    Machines: every shipped profile and random catalog machines of 1 to 16
    devices (a new one every 50 decisions), each under seeded background
    load (busy devices, less free memory) half the time; tasks from the
    training distribution. Half the decisions come from uniformly random
    actions that respect the observation's masks, half from the learned
    policy's exploration (sampled shares and choices), both through
    :class:`lib.policies.actions.Decoder`.

    Returns:
        ``decisions``, ``refused``, ``machines``, ``by_check`` (refusals per
        Gate 1 check), ``seconds``.
    """
    rng = np.random.default_rng((seed, 0x6A7E))
    policy = policy if policy is not None else default_policy()
    learner = getattr(policy, "learner", None)
    enc = ObservationEncoder() if isinstance(learner, SetPPOAgent) else None
    per_machine = 50
    machines = _refusal_machines(rng, max(1, -(-decisions // per_machine)))
    refused, by_check, done = 0, {}, 0
    t0 = time.perf_counter()
    for machine in machines:
        sim = SimulatedTelemetry(machine, seed=int(rng.integers(2**31)),
                                 p_busy=0.4) if rng.random() < 0.5 else None
        for _ in range(min(per_machine, decisions - done)):
            snap: Snapshot = sim.step() if sim is not None else idle(machine)
            task = sample_task(rng, machine, snap)
            decoder = Decoder(machine, snap)
            obs = observe(task, machine, snap, decoder=decoder)
            if enc is not None and done % 2:
                dmask, cmasks = enc.masks(obs)
                out = learner.act_batch(enc.flat(obs)[None], dmask[None],
                                        [None if m is None else m[None]
                                         for m in cmasks], rng=rng)
                action = {k: v[0] for k, v in
                          action_from_choices(out.shares, out.choices).items()}
            else:
                action = sample_masked_action(rng, obs)
            decision = decoder.decide(task, np.asarray(action["shares"]),
                                      int(action["block"]), int(action["mode"]),
                                      int(action["comm_path"]),
                                      int(action["chunks"]))
            verdict = check_decision(decision, task, machine, snap)
            if not verdict.accepted:
                refused += 1
                for c in verdict.checks:
                    by_check[c] = by_check.get(c, 0) + 1
            done += 1
        if done >= decisions:
            break
    out = {"decisions": done, "refused": refused, "machines": len(machines),
           "by_check": by_check, "seconds": time.perf_counter() - t0}
    if verbose:
        print(f"Gate 1 refusals through the masks: {refused} of {done} sampled "
              f"decisions on {out['machines']} machines (shipped profiles and "
              f"random catalog machines of 1-16 devices, idle and loaded)"
              + (f"; by check {by_check}" if by_check else ""))
    return out


def benchmark_toy(iterations: int = 30, batch: int = 512, seed: int = 0,
                  verbose: bool = True) -> dict[str, float]:
    """Train PPO on :class:`SpeedShareProblem`; greedy reward before/after, optimum."""
    problem = SpeedShareProblem()
    rng = np.random.default_rng(seed + 1)
    agent = PPOAgent(problem.obs_dim, problem.n_devices, [problem.n_options],
                     PPOConfig(seed=seed, lr=1e-3, minibatch_size=128))
    t0 = time.perf_counter()
    before = evaluate(agent, problem, rng, 512)
    train_ppo(agent, problem, iterations, batch, rng, evaluate_every=0)
    after = evaluate(agent, problem, rng, 512)
    _, _, _, info = problem.sample(rng, 4096)
    out = {"before": before, "after": after,
           "optimum": float(problem.optimum(info).mean()),
           "seconds": time.perf_counter() - t0}
    if verbose:
        print(f"toy PPO: greedy reward {before:.3f} -> {after:.3f} "
              f"(optimum {out['optimum']:.3f}) in {out['seconds']:.1f} s")
    return out
