"""Timing of the PPO learner: seconds per update and microseconds per decision.

These functions measure and print; no test asserts on them (a slow machine is
not a failure). Figures depend on the BLAS library and its thread count.
"""

from __future__ import annotations

import time

import numpy as np

from lib.agent.ppo import PPOAgent, PPOConfig
from lib.agent.toy import SpeedShareProblem
from lib.contract import STATE_DEVICES, STATE_DIM


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
    from lib.agent.toy import evaluate, train_ppo

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
