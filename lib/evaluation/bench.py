"""Benchmarks: every figure ``gpuhive bench`` prints, in one place.

Each function measures MEASURED wall clock on this computer and returns the
figures (some also print them). No test asserts on a time: a slow or busy
machine is not a failure. Goals are printed next to the figures.

- :func:`optimum_benchmark` -- the exhaustive optimum's search time (2-8 devices);
- :func:`cache_hit_benchmark` -- a sealed-cache hit (Gate 2b load and verify);
- :func:`env_steps_per_second` -- environment steps, one env and a batch;
- :func:`benchmark_update`, :func:`benchmark_act`, :func:`benchmark_toy` -- the
  PPO learner's update and act, and a toy problem with a known optimum;
- decision latency (``optimize`` including Gate 1) is
  :func:`lib.evaluation.metrics.decision_latency`.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from lib.codegen import CodeGenerator, KernelCache
from lib.contract import Decision, TaskSpec
from lib.env.batch import BatchModelEnv
from lib.env.split import EnvConfig, SplitEnv
from lib.learners.ppo import PPOAgent, PPOConfig
from lib.learners.toy import SpeedShareProblem, evaluate, train_ppo
from lib.platform.machines import machine_from_json
from lib.policies.actions import sample_masked_action, sample_masked_actions
from lib.policies.observation import STATE_DEVICES, STATE_DIM
from lib.policies.oracle import optimum

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


def _agent(seed: int) -> PPOAgent:
    """A PPO agent sized for the contract's state vector and two discrete heads."""
    return PPOAgent(STATE_DIM, STATE_DEVICES, [3, 3], PPOConfig(seed=seed))


def _fake_batch(rng: np.random.Generator, agent: PPOAgent,
                batch: int) -> dict[str, np.ndarray]:
    obs = rng.standard_normal((batch, agent.obs_dim))
    dmask = rng.random((batch, agent.n_devices)) < 0.8
    dmask[:, 0] = True
    cmasks = [np.ones((batch, s), dtype=bool) for s in agent.discrete_sizes]
    out = agent.act_batch(obs, dmask, cmasks, rng)
    return {"obs": obs, "device_mask": dmask, "discrete_masks": cmasks,
            "shares": out.shares, "choices": out.choices, "logp": out.logp,
            "advantages": rng.standard_normal(batch),
            "returns": rng.standard_normal(batch)}


def benchmark_update(batch: int = 2048, repeats: int = 3, seed: int = 0,
                     verbose: bool = True) -> float:
    """Median seconds of one :meth:`PPOAgent.update` on ``batch`` rows.

    Default config (10 epochs, minibatch 64), contract-sized observations
    (``STATE_DIM``), ``STATE_DEVICES`` devices and two 3-way heads.
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
    """Percentiles of the latency of one deterministic :meth:`PPOAgent.act`.

    Returns:
        ``{"p50_us": ..., "p99_us": ...}`` microseconds per decision.
    """
    rng = np.random.default_rng(seed)
    agent = _agent(seed)
    obs = rng.standard_normal((n, agent.obs_dim))
    dmask = np.ones(agent.n_devices, dtype=bool)
    lat = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        agent.act(obs[i], dmask, None, deterministic=True)
        lat[i] = time.perf_counter() - t0
    out = {"p50_us": float(np.percentile(lat, 50) * 1e6),
           "p99_us": float(np.percentile(lat, 99) * 1e6)}
    if verbose:
        print(f"PPO act: p50 {out['p50_us']:.0f} us, p99 {out['p99_us']:.0f} us "
              f"over {n} decisions")
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
