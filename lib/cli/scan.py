"""``gpuhive scan``: Gate 2a on a CUDA source file."""

from __future__ import annotations

import argparse

from lib.cli.common import add_json, emit, read_bytes

HELP = "Gate 2a on a CUDA source file"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scan`` to ``subparsers``."""
    p = subparsers.add_parser(
        "scan", help=HELP,
        description="Scan a CUDA source file (and optionally compile options) "
                    "with Gate 2a; exit 0 if accepted, 1 if rejected, 2 if "
                    "the file cannot be read (missing, not a regular file, "
                    "over 16 MiB). The bytes are scanned as they are: a source "
                    "that is not UTF-8 is Gate 2a's to reject.")
    p.add_argument("source", metavar="FILE.cu", help="the CUDA source file")
    p.add_argument("--kernel", required=True, help="the one extern \"C\" "
                                                   "__global__ kernel expected")
    p.add_argument("--option", action="append", metavar="OPT",
                   help="a compile option to check against the allowlist "
                        "(repeatable; use --option=-O3 for dashes)")
    add_json(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the verdict; exit 0 if accepted, 1 if rejected."""
    from lib.security import check_compile_options, scan_source

    # Bytes, not text: Gate 2a judges the encoding itself (bytes.utf8), so a
    # source that is not UTF-8 is rejected with the offending byte (exit 1);
    # a file that cannot be read (missing, a FIFO, a device, too large) is bad
    # input (exit 2).
    source = read_bytes(args.source, "source")
    verdicts = [scan_source(source, args.kernel)]
    if args.option:
        verdicts.append(check_compile_options(args.option))
    violations = [v for verdict in verdicts for v in verdict.violations]
    accepted = not violations
    ms = sum(v.seconds for v in verdicts) * 1e3
    lines = [f"{args.source}: {'accepted' if accepted else 'rejected'} by Gate 2a "
             f"(kernel {args.kernel!r}, {ms:.2f} ms)"]
    lines += [f"  {v}" for v in violations]
    emit(args, {"file": args.source, "kernel": args.kernel, "accepted": accepted,
                "violations": [{"check": v.check, "message": v.message,
                                "line": v.line} for v in violations]},
         "\n".join(lines))
    return 0 if accepted else 1
