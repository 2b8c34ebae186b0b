r"""``gpuhive``: the command line.

    gpuhive doctor                     what this machine can do
    gpuhive explain --kind matmul --dim M=8192 --dim N=8192 --dim K=8192
    gpuhive run --kind reduce --dim N=67108864 --machine local-cpu --verify \
        --backend cpu
    gpuhive validate DECISION.json --task TASK.json --machine hetero-4
    gpuhive characterise --machine local-cpu --backend cpu
    gpuhive calibrate --machine local-cpu --json
    gpuhive codegen --kind matmul --dim M=1024 --dim N=1024 --dim K=1024 --show
    gpuhive scan kernel.cu --kernel my_kernel
    gpuhive security-audit
    gpuhive train --machine hetero-4 --budget quick
    gpuhive evaluate --machine hetero-4 --backend model --budget quick
    gpuhive book --machine hetero-4 --backend model --budget quick

Bad input gets one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from lib.contract import KIND_DIMS, KINDS, ContractError, Decision, TaskSpec
from lib.execution import BACKENDS, BackendUnavailable, ExecutionError
from lib.platform.machines import MachineError, list_machines, load_machine
from lib.policies.baselines import EqualSplit
from lib.policies.registry import POLICIES, make_policy
from lib.runtime import Agent, DecisionRejected
from lib.security import check_decision


class UsageError(ValueError):
    """Bad command-line input (exit status 2)."""



class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"gpuhive: error: {message} (see gpuhive --help)\n")


def fmt_seconds(t: float) -> str:
    """Seconds in a readable unit: ``1.23 ms``."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def _parse_dims(items: Sequence[str]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--dim {item!r}: expected NAME=VALUE, e.g. --dim N=4096")
        try:
            dims[name.strip()] = int(value)
        except ValueError:
            raise UsageError(f"--dim {item!r}: {value!r} is not an integer") from None
    return dims


def _task_from_args(args: argparse.Namespace) -> TaskSpec:
    if getattr(args, "task", None):
        return TaskSpec.from_json(_read(args.task, "task"))
    if not args.kind:
        raise UsageError("give --kind and --dim NAME=VALUE (or --task FILE)")
    return TaskSpec(kind=args.kind, dims=_parse_dims(args.dim or []),
                    dtype=args.dtype)


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"{what} file {path}: {exc.strerror or exc}") from None


def _emit(args: argparse.Namespace, obj: dict[str, Any], text: str) -> None:
    print(json.dumps(obj, indent=2) if args.json else text)


# -- doctor -----------------------------------------------------------------

def cmd_doctor(args: argparse.Namespace) -> int:
    from lib.platform.cudastack import probe

    cuda = probe()
    nvml_reason = ""
    try:
        load_machine("nvml")
    except MachineError as exc:
        nvml_reason = str(exc)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    backends = {
        "model": {"real": False, "why": "predicts with the cost model, Eq. (1) "
                                        "(PREDICTED); always available"},
        "cpu": {"real": True, "why": f"{cores} core(s) as worker processes on "
                                     "local-cpu (MEASURED)"},
        "cuda": {"real": cuda.usable,
                 "why": (f"{cuda.devices} CUDA device(s)" if cuda.usable
                         else "; ".join(cuda.reasons))},
    }
    machines = {}
    for name in list_machines():
        try:
            m = load_machine(name)
            machines[name] = {"devices": m.n, "simulated": m.simulated,
                              "induced": m.induced, "about": m.description}
        except MachineError as exc:
            machines[name] = {"error": str(exc)}
    missing = {"driver": not cuda.driver, "nvrtc": not cuda.nvrtc,
               "nccl": not cuda.nccl, "nvml": bool(nvml_reason)}
    lines = ["machines:"]
    for name, info in machines.items():
        if "error" in info:
            lines.append(f"  {name:<24} unavailable: {info['error']}")
        else:
            tags = " simulated" * info["simulated"] + " induced" * info["induced"]
            lines.append(f"  {name:<24} {info['devices']} device(s){tags}")
    lines.append("backends:")
    for name, info in backends.items():
        state = "real" if info["real"] else ("model" if name == "model" else "absent")
        lines.append(f"  {name:<6} {state:<7} {info['why']}")
    lines.append("CUDA stack: " + ", ".join(
        f"{k} {'missing' if v else 'ok'}" for k, v in missing.items()))
    _emit(args, {"machines": machines, "backends": backends, "missing": missing,
                 "cuda_reasons": list(cuda.reasons), "nvml": nvml_reason or "ok"},
          "\n".join(lines))
    return 0


# -- explain ----------------------------------------------------------------

def _breakdown_table(pred) -> list[str]:
    lines = [f"  {'device':<20} {'share':>6} {'rows':>10} {'launch':>9} {'in':>9} "
             f"{'compute':>9} {'out':>9} {'total':>9}"]
    for d in pred.devices:
        lines.append(
            f"  {d.label:<20} {d.share:6.3f} {d.rows:10d} {fmt_seconds(d.t_launch):>9} "
            f"{fmt_seconds(d.t_in):>9} {fmt_seconds(d.t_comp):>9} "
            f"{fmt_seconds(d.t_out):>9} {fmt_seconds(d.total):>9}")
    lines.append(f"  merge ({pred.comm_path}): {fmt_seconds(pred.t_merge)}")
    return lines


def cmd_explain(args: argparse.Namespace) -> int:
    from lib.costmodel import predict
    from lib.execution.model import params_for

    task = _task_from_args(args)
    agent = Agent(policy=make_policy(args.policy), machine=args.machine)
    params = params_for(agent.machine.name)
    decision = agent.optimize(task)
    pred = predict(task, decision, agent.machine, params=params)
    equal = EqualSplit().decide(task, agent.machine).with_hash(task)
    ref = predict(task, equal, agent.machine, params=params) \
        if check_decision(equal, task, agent.machine).accepted else None
    lines = [f"task        {task.describe()} on {agent.machine.name}"
             f"{' (simulated)' if agent.machine.simulated else ''}",
             f"policy      {agent.policy.name}",
             f"decision    {decision.describe()}",
             f"config_hash {decision.config_hash}",
             f"PREDICTED breakdown (model backend, cost model Eq. (1), "
             f"{pred.params_source} parameters):"]
    lines += _breakdown_table(pred)
    summary = f"PREDICTED total: {fmt_seconds(pred.total)}"
    if ref is not None:
        summary += (f"  (equal split: {fmt_seconds(ref.total)}, "
                    f"{ref.total / pred.total:.2f}x)")
    lines.append(summary)
    from lib.policies.oracle import optimum

    best = optimum(task, agent.machine, params=params)
    lines.append(f"exhaustive optimum: {fmt_seconds(best.total)} "
                 f"({best.decision.describe()}); this decision takes "
                 f"{pred.total / best.total:.2f}x of it")
    _emit(args, {"task": task.to_json(), "machine": agent.machine.name,
                 "policy": agent.policy.name, "decision": decision.to_json(),
                 "prediction": pred.to_json(),
                 "equal_split_seconds": ref.total if ref else None,
                 "optimum_seconds": best.total,
                 "optimum_decision": best.decision.to_json()},
          "\n".join(lines))
    return 0


# -- run --------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    task = _task_from_args(args)
    options: dict[str, Any] = {"seed": args.seed}
    if args.backend == "cpu":
        options.update(repeats=args.repeats, warmup=args.warmup)
    agent = Agent(policy=make_policy(args.policy), machine=args.machine,
                  backend=args.backend, **options)
    try:
        if args.decision:
            decision = Decision.from_json(_read(args.decision, "decision"))
            if args.rehash:
                decision = decision.with_hash(task)
        else:
            decision = agent.optimize(task)
        result = agent.execute(task, decision, verify=args.verify)
    finally:
        agent.close()
    m = result.metrics
    tag = "MEASURED" if m.measured else "PREDICTED"
    lines = [f"{m.label} {task.describe()} on {agent.machine.name}",
             f"decision  {decision.describe()}",
             f"  {'device':<20} {'share':>6} {'seconds':>10}"]
    for pos, g in enumerate(decision.gpus):
        if g in m.per_device_seconds:
            lines.append(f"  {agent.machine.devices[g].label:<20} "
                         f"{decision.shares[pos]:6.3f} "
                         f"{fmt_seconds(m.per_device_seconds[g]):>10}  {tag}")
    lines.append(f"total {fmt_seconds(m.total_seconds)} {tag} ({m.backend} backend"
                 f"{f', median of {m.repeats}' if m.repeats > 1 else ''})")
    if m.verified is not None:
        lines.append(f"verified {str(m.verified).lower()} (max abs error "
                     f"{m.max_abs_error:.3g})")
    _emit(args, {"task": task.to_json(), "machine": agent.machine.name,
                 "decision": decision.to_json(), "metrics": m.to_json()},
          "\n".join(lines))
    return 0 if m.verified is not False else 1


# -- validate ---------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    task = TaskSpec.from_json(_read(args.task, "task"))
    machine = load_machine(args.machine)
    verdict = check_decision(_read(args.decision, "decision"), task, machine)
    lines = [verdict.summary()] + [f"  {v}" for v in verdict.violations[1:]]
    _emit(args, {"accepted": verdict.accepted,
                 "violations": [{"check": v.check, "message": v.message}
                                for v in verdict.violations]}, "\n".join(lines))
    return 0 if verdict.accepted else 1


# -- characterise and calibrate ----------------------------------------------

def cmd_characterise(args: argparse.Namespace) -> int:
    from lib.execution.characterise import CharacterisationError, characterise

    try:
        obj = characterise(args.machine, args.backend, budget=args.budget,
                           seed=args.seed, progress=not args.json,
                           out=Path(args.out) if args.out else None)
    except CharacterisationError as exc:
        raise UsageError(str(exc)) from None
    runs = obj.get("runs", [])
    text = (f"characterised {args.machine} on the {args.backend} backend: "
            f"{len(runs)} MEASURED runs written to {obj.get('path')}\n"
            f"next: gpuhive calibrate --machine {args.machine}")
    _emit(args, {"path": str(obj.get("path")), "runs": len(runs),
                 "machine": args.machine, "backend": args.backend}, text)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from lib.costmodel.calibrate import CalibrationError, calibrate_machine

    try:
        report = calibrate_machine(args.machine, args.characterisation,
                                   holdout=args.holdout, seed=args.seed)
    except CalibrationError as exc:
        raise UsageError(str(exc)) from None
    _emit(args, report.to_json(), report.summary())
    return 0


# -- codegen ----------------------------------------------------------------

def cmd_codegen(args: argparse.Namespace) -> int:
    from lib.cli.codegen import generate_for_cli
    from lib.codegen import CodegenError

    try:
        kernel = generate_for_cli(args.kind, _parse_dims(args.dim or []),
                                  dtype=args.dtype, machine_name=args.machine,
                                  provider=args.provider, model=args.model)
    except CodegenError as exc:
        raise UsageError(str(exc)) from None
    if args.show:
        sys.stdout.write(kernel.source if kernel.source.endswith("\n")
                         else kernel.source + "\n")
        return 0
    _emit(args, {"kernel": kernel.kernel_name, "provider": kernel.provider,
                 "model": kernel.model, "label": kernel.label,
                 "cached": kernel.cached, "fell_back_from": list(kernel.fell_back_from),
                 "reasons": list(kernel.reasons), "ptx_bytes": kernel.ptx_bytes,
                 "registers": kernel.registers}, kernel.describe())
    return 0


# -- scan -------------------------------------------------------------------

def cmd_scan(args: argparse.Namespace) -> int:
    from lib.security import check_compile_options, scan_source

    try:
        source = Path(args.source).read_bytes()
    except OSError as exc:
        raise UsageError(f"source file {args.source}: "
                         f"{exc.strerror or exc}") from None
    verdicts = [scan_source(source, args.kernel)]
    if args.option:
        verdicts.append(check_compile_options(args.option))
    violations = [v for verdict in verdicts for v in verdict.violations]
    accepted = not violations
    ms = sum(v.seconds for v in verdicts) * 1e3
    lines = [f"{args.source}: {'accepted' if accepted else 'rejected'} by Gate 2a "
             f"(kernel {args.kernel!r}, {ms:.2f} ms)"]
    lines += [f"  {v}" for v in violations]
    _emit(args, {"file": args.source, "kernel": args.kernel, "accepted": accepted,
                 "violations": [{"check": v.check, "message": v.message,
                                 "line": v.line} for v in violations]},
          "\n".join(lines))
    return 0 if accepted else 1


# -- security-audit ---------------------------------------------------------

def cmd_security_audit(args: argparse.Namespace) -> int:
    from lib.evaluation.audit import run_audit

    report = run_audit(repeats=args.repeats, seed=args.seed)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.to_text())
    perfect = (report.recall == 1.0 and report.intended_accuracy == 1.0
               and report.false_positive_rate == 0.0)
    return 0 if perfect else 1


# -- sweep ------------------------------------------------------------------

def cmd_sweep(args: argparse.Namespace) -> int:
    from lib.cli.sweep import sweep

    report = sweep(args.machine, args.backend, scale=args.scale,
                   repeats=args.repeats, out=Path(args.out) if args.out else None)
    lines = [f"sweep on {report['machine']} ({args.backend} backend), "
             f"{report['wall_seconds']:.1f} s"]
    for r in report["rows"]:
        lines.append(f"  {r['kind']:<12} {r['plan']:<12} "
                     f"{fmt_seconds(r['total_seconds']):>10} {r['label']:<16} "
                     f"verified {str(r['verified']).lower()}")
    if args.out:
        lines.append(f"written to {args.out}")
    _emit(args, report, "\n".join(lines))
    return 0 if report["all_verified"] else 1


# -- train ------------------------------------------------------------------

def cmd_train(args: argparse.Namespace) -> int:
    from lib.training.pipeline import TrainConfig, train

    config = TrainConfig(machine=args.machine, budget=args.budget, seed=args.seed,
                         learner=args.learner, features=args.features,
                         use_mask=not args.no_mask,
                         curriculum=not args.no_curriculum)
    out = Path(args.out or f"_build/train/{args.machine}-{args.budget}-{args.seed}")
    result = train(config, out, progress=not args.json, resume=not args.fresh)
    if args.json:
        print(json.dumps(result.summary(), indent=2, default=str))
    return 0


# -- evaluate ---------------------------------------------------------------

def cmd_evaluate(args: argparse.Namespace) -> int:
    from lib.evaluation.harness import evaluate

    if args.policy and not Path(args.policy).is_file():
        raise UsageError(f"policy file {args.policy} does not exist")
    report = evaluate(args.machine, args.backend, args.budget, seed=args.seed,
                      policy_path=args.policy, progress=not args.json)
    if args.markdown:
        Path(args.markdown).write_text(report.to_markdown())
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print(report.to_text())
    return 0


# -- bench ------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmarks that print figures (MEASURED wall clock on this computer)."""
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
        from lib.evaluation.harness import decision_latency
        from lib.platform.telemetry import idle
        from lib.policies.registry import default_policy

        machine = load_machine("hetero-4")
        lat = decision_latency(default_policy(), machine, [idle(machine)],
                               n=max(100, args.repeats * 20))
        out["decision_latency"] = lat
        lines.append(f"decision latency, optimize incl. Gate 1 on fresh tasks "
                     f"(goal: p50 <= 100 us, p99 <= 1 ms): p50 {lat['p50_us']:.0f} "
                     f"us, p99 {lat['p99_us']:.0f} us")
    _emit(args, out, "\n".join(lines))
    return 0


# -- book -------------------------------------------------------------------

def cmd_book(args: argparse.Namespace) -> int:
    from lib.book import BookError, build_book

    try:
        build_book(machine=args.machine, backend=args.backend, budget=args.budget,
                   seed=args.seed, html=not args.no_html)
    except BookError as exc:
        print(f"gpuhive: book failed: {exc}", file=sys.stderr)
        return 1
    return 0


# -- parser -----------------------------------------------------------------

def _task_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=KINDS, help="workload class")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE",
                   help="a dimension, repeated: " + "; ".join(
                       f"{k}: {','.join(d)}" for k, d in KIND_DIMS.items()))
    p.add_argument("--dtype", default="fp32", choices=("fp16", "bf16", "fp32", "fp64"))
    p.add_argument("--task", metavar="FILE", help="task JSON instead of --kind/--dim")
    p.add_argument("--machine", default="hetero-4",
                   help="machine profile (gpuhive doctor lists them)")
    p.add_argument("--policy", default="rl", choices=tuple(POLICIES),
                   help="rl: the shipped learned policy (default); or a baseline")
    p.add_argument("--json", action="store_true", help="print JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpuhive", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("doctor", help="machine profiles and which backends are real")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("explain", help="the decision for a task and its predicted "
                                       "per-device breakdown")
    _task_args(p)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("run", help="decide, validate, execute, optionally verify")
    _task_args(p)
    p.add_argument("--backend", default="model", choices=BACKENDS)
    p.add_argument("--decision", metavar="FILE", help="run this decision JSON "
                                                     "instead of the policy's")
    p.add_argument("--rehash", action="store_true",
                   help="recompute the decision file's config_hash")
    p.add_argument("--verify", action="store_true",
                   help="compare the result with the NumPy reference")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    p.add_argument("--repeats", type=int, default=1, help="timed repeats (cpu)")
    p.add_argument("--warmup", type=int, default=0, help="untimed runs first (cpu)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="Gate 1 on a decision file")
    p.add_argument("decision", metavar="DECISION.json")
    p.add_argument("--task", required=True, metavar="TASK.json")
    p.add_argument("--machine", default="hetero-4")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("characterise", help="measure what a profile only "
                                            "estimates (runs real workloads)")
    p.add_argument("--machine", default="local-cpu")
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--budget", default="quick", choices=("smoke", "quick", "full"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="FILE", help="default: "
                   "$GPUHIVE_HOME/characterisation/<machine>.json")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_characterise)

    p = sub.add_parser("calibrate", help="fit the cost model to measured runs and "
                                         "report its error on held-out runs")
    p.add_argument("--machine", default="local-cpu")
    p.add_argument("--characterisation", metavar="FILE",
                   help="default: $GPUHIVE_HOME/characterisation/<machine>.json")
    p.add_argument("--holdout", type=float, default=0.3,
                   help="fraction of runs held out for scoring")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("codegen", help="CUDA source specialised to the decision "
                                       "for a task, through Gate 2")
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--dim", action="append", metavar="NAME=VALUE")
    p.add_argument("--dtype", default="fp32", choices=("fp16", "bf16", "fp32", "fp64"))
    p.add_argument("--machine", default="hetero-4")
    p.add_argument("--provider", default="template",
                   choices=("template", "openai", "anthropic", "openai-compatible",
                            "recorded"))
    p.add_argument("--model", help="LLM model name (default from GPUHIVE_*_MODEL)")
    p.add_argument("--show", action="store_true",
                   help="print the final source on stdout and nothing else")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_codegen)

    p = sub.add_parser("scan", help="Gate 2a on a CUDA source file")
    p.add_argument("source", metavar="FILE.cu")
    p.add_argument("--kernel", required=True, help="the one extern \"C\" "
                                                   "__global__ kernel expected")
    p.add_argument("--option", action="append", metavar="OPT",
                   help="a compile option to check against the allowlist "
                        "(repeatable; use --option=-O3 for dashes)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_scan)

    p = sub.add_parser("security-audit", help="the injection suite over the three "
                                              "gates: recall, false positives, "
                                              "latency")
    p.add_argument("--repeats", type=int, default=3, help="gate calls per case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_security_audit)

    p = sub.add_parser("sweep", help="every kind on one device and on all "
                                     "devices, timed and verified (make gpu-check)")
    p.add_argument("--machine", default="local-cpu")
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiplies every task's divisible dimension")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", metavar="FILE", help="write the JSON here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("train", help="the three-stage training pipeline "
                                     "(cost model, noisy calibrated model, "
                                     "measured runs)")
    p.add_argument("--machine", default="hetero-4")
    p.add_argument("--budget", default="quick", choices=("smoke", "quick", "full"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--learner", default="ppo", choices=("ppo", "td3"))
    p.add_argument("--features", default="all",
                   choices=("all", "no-telemetry", "no-topology"))
    p.add_argument("--no-mask", action="store_true",
                   help="ablation: act without the action mask")
    p.add_argument("--no-curriculum", action="store_true",
                   help="ablation: train on the target machine only")
    p.add_argument("--out", metavar="DIR", help="checkpoints, curves and the "
                   "policy (default _build/train/<machine>-<budget>-<seed>)")
    p.add_argument("--fresh", action="store_true",
                   help="ignore checkpoints and start over")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="Table 4, ablations, transfer and the "
                                        "targets T1-T7")
    p.add_argument("--machine", default="hetero-4")
    p.add_argument("--backend", default="model", choices=BACKENDS)
    p.add_argument("--budget", default="quick", choices=("smoke", "quick", "full"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", metavar="FILE", help="a trained policy (.npz); "
                                                   "default the shipped one")
    p.add_argument("--markdown", metavar="FILE", help="also write the Markdown "
                                                     "report here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("bench", help="benchmarks that print figures: optimum "
                                     "search, cache hit, env steps/s, PPO update, "
                                     "decision latency")
    p.add_argument("--what", nargs="+", default=["optimum", "cache", "env", "ppo",
                                                 "latency"],
                   choices=("optimum", "cache", "env", "ppo", "latency"))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("book", help="execute the notebooks and build the HTML book")
    p.add_argument("--machine", default="hetero-4")
    p.add_argument("--backend", default="model", choices=BACKENDS)
    p.add_argument("--budget", default="quick", choices=("smoke", "quick", "full"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-html", action="store_true",
                   help="execute the notebooks only")
    p.set_defaults(func=cmd_book)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuhive`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, ContractError, MachineError, DecisionRejected,
            BackendUnavailable) as exc:
        print(f"gpuhive: error: {exc}", file=sys.stderr)
        return 2
    except ExecutionError as exc:
        print(f"gpuhive: execution failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpuhive: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("GPUHIVE_DEBUG"):
            raise
        print(f"gpuhive: internal error: {type(exc).__name__}: {exc} "
              "(set GPUHIVE_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
