"""``gpuhive bench``: benchmarks that print figures (MEASURED wall clock on
this computer)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from lib.cli.common import add_json, emit, repeats_type

HELP = "benchmarks that print figures: optimum search, cache hit, env steps/s, " \
       "PPO update, decision latency"
#: The benchmarks ``--what`` chooses from, in the order they run.
BENCHMARKS: tuple[str, ...] = ("optimum", "cache", "env", "ppo", "latency",
                                "refusals", "dask")
#: What runs without --what: all but dask, which starts a local Dask cluster.
DEFAULT_BENCHMARKS = [b for b in BENCHMARKS if b != "dask"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``bench`` to ``subparsers``."""
    p = subparsers.add_parser(
        "bench", help=HELP,
        description="Time the exhaustive optimum search, a kernel cache hit, "
                    "environment steps, a PPO update and decision latency on "
                    "this computer, each against its goal; with --what dask, the "
                    "dask backend against the cpu backend on the same cores.")
    p.add_argument("--what", nargs="+", default=DEFAULT_BENCHMARKS,
                   choices=BENCHMARKS, metavar="NAME",
                   help=f"the benchmarks to run, of {', '.join(BENCHMARKS)} "
                        "(default: all but dask, which starts a local cluster and "
                        "times the same decision on the cpu and dask backends)")
    p.add_argument("--repeats", type=repeats_type, default=20,
                   help="repeats of each timing; the benchmarks scale their own "
                        "counts from it (default: %(default)s)")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmarks and print their figures; exit 0."""
    out: dict[str, Any] = {}
    lines = ["benchmarks, MEASURED wall clock on this computer (the times the "
             "optimum and the environment compute are PREDICTED):"]
    want = set(args.what)
    if "optimum" in want:
        from lib.evaluation.bench import optimum_benchmark

        rows = optimum_benchmark(repeats=args.repeats)
        out["optimum"] = rows
        lines.append("exhaustive optimum search (goal: under 50 ms for 8 devices)")
        lines += [f"  {r['devices']} devices: median {r['median_ms']:.2f} ms, p90 "
                  f"{r['p90_ms']:.2f} ms, {r['candidates']} candidates"
                  for r in rows]
    if "cache" in want:
        from lib.evaluation.bench import cache_hit_benchmark

        hit = cache_hit_benchmark(repeats=max(20, args.repeats * 10), quiet=True)
        out["cache_hit"] = hit
        lines.append(f"kernel cache hit, verify + load (goal: under 1 ms): p50 "
                     f"{hit['p50_ms']:.2f} ms, p90 {hit['p90_ms']:.2f} ms")
    if "env" in want:
        from lib.evaluation.bench import env_steps_per_second

        env = env_steps_per_second(n_steps=max(200, args.repeats * 50))
        out["env"] = env
        lines.append(f"environment steps per second (model backend): single "
                     f"{env['single_steps_per_s']:.0f}, batch of {env['batch']} "
                     f"{env['batch_steps_per_s']:.0f}")
    if "ppo" in want:
        from lib.evaluation.bench import benchmark_update

        secs = benchmark_update(verbose=False)
        out["ppo_update_s"] = secs
        lines.append(f"PPO update on a batch of 2048: {secs:.2f} s")
    if "latency" in want:
        from lib.evaluation.bench import latency_benchmark

        rows = latency_benchmark(tasks=max(100, args.repeats * 20), verbose=False)
        out["decision_latency"] = rows[0]
        out["decision_latency_by_devices"] = rows
        lines.append("decision latency, optimize incl. hash and Gate 1 on fresh tasks "
                     "(MEASURED on this computer):")
        lines += [f"  {r['devices']} devices: p50 {r['p50_us']:.0f} us, p99 "
                  f"{r['p99_us']:.0f} us (goal p50 <= {r['goal_p50_us']:.0f} us"
                  + ("" if math.isnan(r["goal_p99_us"])
                     else f", p99 <= {r['goal_p99_us']:.0f} us")
                  + f": {'met' if r['met'] else 'NOT met'})" for r in rows]
    if "refusals" in want:
        from lib.evaluation.bench import refusal_benchmark

        ref = refusal_benchmark(decisions=10_000 if args.repeats >= 20 else 1_000,
                                verbose=False)
        out["refusals"] = ref
        lines.append(f"Gate 1 refusals through the masks (goal: none): "
                     f"{ref['refused']} of {ref['decisions']} sampled decisions on "
                     f"{ref['machines']} machines")
    if "dask" in want:
        from lib.execution.dask_measure import benchmark as dask_benchmark
        from lib.execution.dask_measure import benchmark_lines as dask_lines

        figures = dask_benchmark(repeats=max(3, args.repeats // 4),
                                 tiny_repeats=max(20, args.repeats))
        out["dask"] = figures
        lines += dask_lines(figures)
    emit(args, out, "\n".join(lines))
    return 0
