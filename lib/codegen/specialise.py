"""The template provider: one kernel source, specialised to one decision.

``kernels/<kind>.cu`` is the only copy of each kernel's logic. For a task and a
decision, :func:`render_template` renders ``kernels/templates/kernel.cu.j2``: a
header naming what the text was specialised for, one ``#define`` per tunable
(which wins over the file's ``#ifndef`` default), then the kernel file cut down
by :func:`single_kernel` to the one ``extern "C"`` entry point of the task's
dtype. Gate 2a requires exactly one kernel per source, and a module built for a
decision needs no other.

Tunables (:func:`tunables`) come from the decision where it names them:

======================  ======================================================
macro                   value
======================  ======================================================
``MATMUL_TILE``         16 (the file's default; ``overrides`` may change it)
``MATMUL_MAX_THREADS``  the decision's block size (``__launch_bounds__``)
``REDUCE_MAX_THREADS``  the decision's block size (sizes the shared array)
``HISTOGRAM_MAX_BINS``  the task's bin count B (the shared counters)
======================  ======================================================

The decision's ``chunk`` changes how many elements each launch covers, not the
kernel text; it is part of the config hash, hence of the cache key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import jinja2

from lib.contract import Decision, TaskSpec

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
"""``kernels/`` at the top of the project: one ``<kind>.cu`` per workload."""

TEMPLATES_DIR = KERNELS_DIR / "templates"
TEMPLATE_NAME = "kernel.cu.j2"

#: dtypes each kind has an entry point for (``<kind>_<dtype>``).
KIND_DTYPES: dict[str, tuple[str, ...]] = {
    "matmul": ("fp32", "fp16", "bf16"),
    "reduce": ("fp32", "fp16", "bf16"),
    "elementwise": ("fp32", "fp16", "bf16"),
    "stencil": ("fp32", "fp64"),
    "histogram": ("fp32",),
}

ENTRY_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)
"""An ``extern "C" __global__`` definition; group 1 is the kernel's name."""

_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__')
_NAME_RE = re.compile(r"([A-Za-z_]\w*)\s*\(")


class CodegenError(ValueError):
    """A request the code-gen plane cannot serve (the message names why)."""


def kernel_path(kind: str) -> Path:
    """``kernels/<kind>.cu``; raises :class:`CodegenError` when there is none."""
    path = KERNELS_DIR / f"{kind}.cu"
    if not path.is_file():
        raise CodegenError(f"no kernel source for kind {kind!r} at {path}")
    return path


def entry_points(source: str) -> list[str]:
    """Names of the ``extern "C" __global__`` functions defined in ``source``."""
    return ENTRY_RE.findall(source)


def entry_name(kind: str, dtype: str) -> str:
    """The entry point for ``kind`` and ``dtype``, e.g. ``"matmul_fp16"``.

    Raises:
        CodegenError: the kind has no kernel for that dtype.
    """
    if kind not in KIND_DTYPES:
        raise CodegenError(f"unknown kind {kind!r}; expected one of "
                           f"{', '.join(KIND_DTYPES)}")
    if dtype not in KIND_DTYPES[kind]:
        raise CodegenError(f"{kind} has no {dtype} kernel; it has "
                           f"{', '.join(KIND_DTYPES[kind])}")
    return f"{kind}_{dtype}"


def single_kernel(source: str, keep: str) -> str:
    """``source`` with every ``extern "C" __global__`` function but ``keep``
    removed (textually: from the marker to the brace that closes its body).

    Everything else (includes, macros, the shared ``__device__`` template) is
    kept as written, so the result is the same logic with fewer entry points.

    Raises:
        CodegenError: ``keep`` is not one of the kernels of ``source``.
    """
    spans, names = [], []
    for m in _KERNEL_RE.finditer(source):
        open_at = source.index("{", m.end())
        names += [n for n in _NAME_RE.findall(source, m.end(), open_at)
                  if n not in ("__launch_bounds__", "__attribute__")][:1]
        depth, k = 0, open_at
        while True:
            depth += {"{": 1, "}": -1}.get(source[k], 0)
            if depth == 0:
                break
            k += 1
        spans.append((m.start(), k + 1))
    if keep not in names:
        raise CodegenError(f"kernel {keep!r} not found; the source defines "
                           f"{', '.join(names) or 'none'}")
    out, last = [], 0
    for name, (lo, hi) in zip(names, spans, strict=True):
        if name != keep:
            out.append(source[last:lo])
            last = hi
    out.append(source[last:])
    # Removing a kernel leaves the blank lines around it; keep at most one.
    return re.sub(r"\n{3,}", "\n\n", "".join(out))


def tunables(task: TaskSpec, decision: Decision,
             overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """The ``#define`` values for ``task``'s kernel under ``decision``.

    Args:
        overrides: macro -> value, applied last (e.g. ``{"MATMUL_TILE": 8}``).
    """
    block = int(decision.block)
    values: dict[str, int] = {
        "matmul": {"MATMUL_TILE": 16, "MATMUL_MAX_THREADS": block},
        "reduce": {"REDUCE_MAX_THREADS": block},
        "histogram": {"HISTOGRAM_MAX_BINS": task.dims.get("B", 4096)},
    }.get(task.kind, {})
    for name, value in (overrides or {}).items():
        if name not in values:
            raise CodegenError(f"{task.kind} has no tunable {name}; it has "
                               f"{', '.join(values) or 'none'}")
        values[name] = int(value)
    return values


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False,
    )


def template_version(kind: str) -> str:
    """16 hex digits of SHA-256 over the template and ``kernels/<kind>.cu``.

    Part of every cache key: editing either invalidates the cached kernels.
    """
    digest = hashlib.sha256()
    for path in (TEMPLATES_DIR / TEMPLATE_NAME, kernel_path(kind)):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def render_template(task: TaskSpec, decision: Decision,
                    overrides: Mapping[str, int] | None = None) -> str:
    """CUDA source of ``task``'s kernel specialised to ``decision``.

    Returns:
        The rendered text: one entry point, ``<kind>_<dtype>``, with the
        :func:`tunables` defined ahead of the kernel file's defaults.
    """
    entry = entry_name(task.kind, task.dtype)
    body = single_kernel(kernel_path(task.kind).read_text(), entry)
    return _environment().get_template(TEMPLATE_NAME).render(
        kind=task.kind, entry=entry, task=task.describe(), block=decision.block,
        chunk=decision.chunk, version=template_version(task.kind),
        defines=sorted(tunables(task, decision, overrides).items()), body=body,
    )
