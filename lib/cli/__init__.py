r"""gpuhive decides how to spread one divisible task over several devices
(GPUs, CPU cores, the workers of a Dask cluster), and measures, calibrates,
trains and evaluates the policy that decides.

examples:
    gpuhive doctor                     what this machine can do
    gpuhive explain --kind matmul --dim M=8192 --dim N=8192 --dim K=8192
    gpuhive run --kind reduce --dim N=67108864 --machine local-cpu --verify \
        --backend cpu
    gpuhive decide --kind reduce --dim N=1000000 > d.json
    gpuhive validate d.json             Gate 1 on what decide printed
    gpuhive run --decision d.json --verify
    gpuhive characterise --machine local-cpu --backend cpu
    gpuhive calibrate --machine local-cpu --json
    gpuhive codegen --kind matmul --dim M=1024 --dim N=1024 --dim K=1024 --show
    gpuhive scan kernel.cu --kernel my_kernel
    gpuhive security-audit
    gpuhive sweep --machine local-cpu --backend cpu
    gpuhive run --kind matmul --dim M=2048 --dim N=2048 --dim K=2048 \
        --machine dask://scheduler-host:8786 --backend dask --verify
    gpuhive train --machine hetero-4 --budget quick
    gpuhive evaluate --machine hetero-4 --backend model --budget quick
    gpuhive bench --what optimum latency
    gpuhive book --machine hetero-4 --backend model --budget quick

Bad input gets one line on stderr and exit status 2, never a traceback.
When the reader of stdout goes away (``gpuhive explain ... | head -1``) the
command stops quietly with exit status 141, what a shell reports for a tool
that SIGPIPE ended (``cat``, ``grep``): under ``set -o pipefail`` the cut-short
output still shows.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
from collections.abc import Sequence
from typing import NoReturn

import lib
from lib.cli import (
    bench,
    book,
    calibrate,
    characterise,
    codegen,
    decide,
    doctor,
    evaluate,
    explain,
    history,
    run,
    scan,
    security_audit,
    server_setup,
    sweep,
    train,
    validate,
)
from lib.cli.common import UsageError, check_home

__all__ = ["COMMANDS", "UsageError", "build_parser", "main"]

#: The command modules, in the order ``gpuhive --help`` lists them; each has
#: ``add_parser(subparsers)`` and ``run(args) -> int``.
COMMANDS = (doctor, explain, decide, run, validate, characterise, calibrate,
            history, codegen, scan, security_audit, sweep, train, evaluate, bench,
            book, server_setup)

#: Errors that mean the input was bad (one line on stderr, exit status 2), as
#: (defining module, class name). Named, not imported: most of their modules
#: are heavy (the execution backends, the runtime and its policies), and a
#: command that never loads one cannot raise its error (:func:`_is_one_of`).
BAD_INPUT = (("lib.cli.common", "UsageError"), ("lib.contract", "ContractError"),
             ("lib.platform.machines", "MachineError"),
             ("lib.runtime", "DecisionRejected"),
             ("lib.execution.base", "BackendUnavailable"),
             ("lib.platform.telemetry", "TelemetryError"),
             ("lib.storage", "StorageError"),
             ("lib.costmodel.parameters", "CalibrationError"),
             ("lib.security.seal", "SealError"),
             ("lib.contract", "NoFeasibleDecision"))
#: A run that failed on a device or backend: one line, exit status 1.
EXECUTION_FAILED = (("lib.execution.base", "ExecutionError"),)
#: The exit status when stdout's reader has gone: 128 + SIGPIPE, as for a tool
#: the signal ended.
EXIT_PIPE = 141


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gpuhive: error: {message} (see gpuhive --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``gpuhive`` parser, one subcommand per module of :data:`COMMANDS`."""
    parser = _Parser(prog="gpuhive", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--version", action="version",
                        version=f"gpuhive {lib.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuhive`` console script; returns the exit status."""
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            sys.stdout.flush()  # --help or --version into a closed pipe
            raise
        status = _run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError as exc:
        if not _stdout_gone():
            return _internal_error(exc)
        # As the Python docs advise: point stdout at devnull so the flush at
        # exit cannot fail again, and stop without a word.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (AttributeError, OSError, ValueError):
            pass
        return EXIT_PIPE


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command, mapping its errors to exit statuses."""
    try:
        check_home()
        return args.run(args)
    except KeyboardInterrupt:
        _end_bars()
        print("gpuhive: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise
    except Exception as exc:
        _end_bars()
        if _is_one_of(exc, BAD_INPUT):
            print(f"gpuhive: error: {exc}", file=sys.stderr)
            return 2
        if _is_one_of(exc, EXECUTION_FAILED):
            print(f"gpuhive: execution failed: {exc}", file=sys.stderr)
            return 1
        return _internal_error(exc)


def _end_bars() -> None:
    """Close the progress bars a command cut short left open, so the line
    that says why starts a line of its own (it was glued to the bar:
    ``... 83.29it/s]gpuhive: interrupted``). Nothing is imported here."""
    std = sys.modules.get("tqdm.std")
    for bar in list(getattr(getattr(std, "tqdm", None), "_instances", ())):
        try:
            bar.close()
        except Exception:
            pass


def _is_one_of(exc: BaseException, names: Sequence[tuple[str, str]]) -> bool:
    """Whether ``exc`` is an instance of one of the classes ``names`` (defining
    module, class name). A class whose module was never imported has no
    instances, so only modules already loaded are looked in: nothing is
    imported here."""
    for module, name in names:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


def _internal_error(exc: BaseException) -> int:
    if os.environ.get("GPUHIVE_DEBUG"):
        raise exc
    print(f"gpuhive: internal error: {type(exc).__name__}: {exc} "
          "(set GPUHIVE_DEBUG=1 for the traceback)", file=sys.stderr)
    return 1


def _stdout_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (so a
    BrokenPipeError came from there, not from some other pipe)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True  # no poll here, or no stdout to ask: trust the exception


if __name__ == "__main__":
    sys.exit(main())
