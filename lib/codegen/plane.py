"""The code-gen plane: (task, decision) -> a compiled, gated kernel.

:meth:`CodeGenerator.generate` serves one request:

1. the cache key (config hash, provider, model, template version); a hit is
   re-verified by Gate 2b and returned, a tampered entry is evicted and logged;
2. on a miss, the provider writes the source: the template (deterministic,
   :mod:`lib.codegen.specialise`) or an LLM (:mod:`lib.codegen.llm`), whose
   answer must hold exactly one code block;
3. Gate 2a scans the source and the compile options; NVRTC compiles it to PTX;
   an LLM's kernel must also pass Gate 2c on that PTX
   (:mod:`lib.security.ptx`: no state that outlives a launch, no clocks, sleeps,
   traps, system-scope atomics, unresolved or indirect calls, no recursion),
   the numerical spot check against NumPy (:mod:`lib.codegen.spotcheck`,
   emulated on the CPU here, on the device where there is one), and ptxas
   in the sandbox (a module it refuses, or a function whose stack or spills
   pass the limit, is refused);
4. the kernel is sealed (Gate 2b) into the cache and returned as a
   :class:`GeneratedKernel`.

A rejected LLM answer is logged with its reason and never cached; the template
takes over (``fell_back_from``/``reasons`` say why), so every request that the
template can serve gets a kernel.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lib import security as security_package
from lib.codegen import emulate as emulate_module
from lib.codegen import isolation, llm, nvrtc, spotcheck
from lib.codegen.cache import KernelCache, cache_key
from lib.codegen.emulate import EmulationError
from lib.codegen.specialise import (
    CodegenError,
    entry_name,
    render_template,
    template_version,
    tunables,
)
from lib.contract import Decision, TaskSpec, config_hash
from lib.security import Verdict, check_compile_options, scan_source
from lib.security.ptx import check_ptx

log = logging.getLogger("lib.codegen")

DEFAULT_ARCH = 80
"""Compute capability PTX is generated for (compute_80 runs on sm_80 and newer)."""

LABELS = {"template": "TEMPLATE", "recorded": "RECORDED"}


@functools.cache
def checks_digest() -> str:
    """12 hex digits of the SHA-256 of the code that checks an untrusted
    kernel: the security layer (Gate 2a's scanner, Gate 2c, the sandbox),
    the spot check and the emulation it runs in, with its headers. Part of
    an LLM answer's cache key, so that a change to any check is a miss."""
    files = sorted(Path(security_package.__file__).parent.rglob("*.py"))
    files += [Path(m.__file__) for m in (spotcheck, isolation, emulate_module)]
    files += sorted(p for p in (Path(emulate_module.__file__).parent / "emu").rglob("*")
                    if p.is_file())
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class GeneratedKernel:
    """A kernel the plane hands to the execution plane.

    Attributes:
        source: the CUDA source that passed Gate 2a (and was sealed).
        kernel_name: its one entry point, ``<kind>_<dtype>``.
        provider: who wrote the source: ``"template"``, ``"openai"``, ...
        model: the LLM model (``None`` for the template).
        label: ``"TEMPLATE"``, ``"LLM"`` or ``"RECORDED"``.
        arch: the target, ``"compute_80"``.
        options: NVRTC options, Gate-2a-checked (defines are in the source).
        ptx: the compiled PTX text.
        verdicts: gate -> Verdict: ``"gate2a"`` (source), ``"gate2a.options"``
            and ``"gate2b"`` (the seal, checked at write and on every hit).
        resources: ptxas usage per entry (registers, shared_bytes, spills...)
            for the miss that compiled it, where nvcc is on PATH; else None.
        spot: the numerical spot check (LLM kernels; None for the template).
        cached: served from the cache (verified by Gate 2b).
        cache_key: the 64-hex key the entry is stored and sealed under.
        fell_back_from: providers whose answers were rejected, in order.
        reasons: why each was rejected (one line each).
        refused_by: the check that rejected each, one of :data:`CHECKS`.
        seconds: wall time of the request.
    """

    source: str
    kernel_name: str
    provider: str
    model: str | None
    label: str
    arch: str
    options: tuple[str, ...]
    ptx: str
    verdicts: Mapping[str, Verdict]
    resources: Mapping[str, Mapping[str, int]] | None = None
    spot: spotcheck.SpotResult | None = None
    cached: bool = False
    cache_key: str = ""
    fell_back_from: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    refused_by: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def ptx_bytes(self) -> int:
        """Size of the PTX, bytes."""
        return len(self.ptx.encode())

    @property
    def registers(self) -> int | None:
        """Registers per thread of the entry point, where ptxas measured it."""
        usage = (self.resources or {}).get(self.kernel_name)
        return usage.get("registers") if usage else None

    def describe(self) -> str:
        """A few lines for the command line (everything but the source)."""
        lines = [f"kernel   {self.kernel_name} [{self.label}] provider="
                 f"{self.provider}" + (f" model={self.model}" if self.model else ""),
                 f"compile  {self.arch} ptx={self.ptx_bytes} B "
                 f"options={' '.join(self.options)}"
                 + (f" registers={self.registers}" if self.registers else ""),
                 f"cache    {'hit' if self.cached else 'miss'} key="
                 f"{self.cache_key[:16]}"]
        lines += [f"gate     {name}: " + ("accepted" if v.accepted else v.summary())
                  for name, v in self.verdicts.items()]
        if self.spot is not None:
            lines.append(f"spot     {'PASS' if self.spot.passed else 'FAIL'} "
                         f"max|err|={self.spot.max_abs_error:.3g} on "
                         f"{self.spot.task} ({self.spot.runner})")
        for who, why in zip(self.fell_back_from, self.reasons, strict=True):
            lines.append(f"fallback {who} rejected: {why}")
        return "\n".join(lines)


#: Stack (local memory) per thread a generated kernel may use, bytes (the
#: project's kernels use none; ptxas reports recursion as a large stack).
MAX_STACK_BYTES = 4096


#: What can refuse an untrusted answer, in the order the plane applies them,
#: with the name a person reads.
CHECKS: dict[str, str] = {
    "provider": "the provider (no answer, or no code block in it)",
    "gate2a": "Gate 2a",
    "sandbox": "the sandbox",
    "gate2a.compiled": "Gate 2a on the text the compilers see",
    "nvrtc": "NVRTC",
    "ptx": "Gate 2c on the compiled PTX",
    "spot": "the spot check",
    "resources": "the resource limits",
}


class Rejected(Exception):
    """One candidate source failed a check; the message is the reason and
    ``check`` which check it was (a key of :data:`CHECKS`)."""

    def __init__(self, reason: str, check: str = "provider"):
        super().__init__(reason)
        self.check = check


@dataclass
class CodeGenerator:
    """Serves kernels for (task, decision) pairs behind one sealed cache.

    Args:
        cache: the kernel cache; default :class:`KernelCache` under
            ``$GPUHIVE_HOME``. ``None`` there means that default; pass
            ``use_cache=False`` to compile every time.
        arch: compute capability to compile for (80: ``compute_80``).
        spot_runner: where LLM kernels are spot-checked: ``"auto"``,
            ``"emulated"`` or ``"cuda"`` (:mod:`lib.codegen.spotcheck`).
        measure_resources: run ptxas (when nvcc is on PATH) on each miss.
    """

    cache: KernelCache | None = None
    arch: int = DEFAULT_ARCH
    spot_runner: str = "auto"
    measure_resources: bool = True
    use_cache: bool = True
    _compiler: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        if self.use_cache and self.cache is None:
            self.cache = KernelCache()

    @property
    def options(self) -> tuple[str, ...]:
        return (f"--gpu-architecture=compute_{self.arch}", "--std=c++17")

    def generate(self, task: TaskSpec, decision: Decision,
                 provider: str | llm.Provider = "template", *,
                 model: str | None = None,
                 overrides: Mapping[str, int] | None = None) -> GeneratedKernel:
        """The kernel for ``task`` under ``decision`` from ``provider``.

        Args:
            provider: ``"template"``, a name of :data:`lib.codegen.llm.PROVIDERS`
                or a provider object (e.g. one pointed at another base URL).
            model: the LLM model (default from the provider's environment
                variable).
            overrides: tunables for the template (``{"MATMUL_TILE": 8}``).

        Raises:
            CodegenError: the template itself could not be served (a bug, or
                no NVRTC).
        """
        start = time.perf_counter()
        digest = config_hash(task, decision)
        fell, reasons, checks = [], [], []
        if provider != "template":
            try:
                source = provider if not isinstance(provider, str) else \
                    llm.make_provider(provider, model)
                return self._serve(task, decision, digest, source, overrides,
                                   start)
            except Rejected as why:
                name = provider if isinstance(provider, str) else provider.name
                fell.append(name)
                reasons.append(str(why))
                checks.append(why.check)
                log.warning("rejected %s kernel for %s: %s; the template takes "
                            "over", name, task.describe(), why)
        kernel = self._serve(task, decision, digest, None, overrides, start)
        return _replace(kernel, fell_back_from=tuple(fell), reasons=tuple(reasons),
                        refused_by=tuple(checks),
                        seconds=time.perf_counter() - start)

    # ---- one provider ----------------------------------------------------------

    def _serve(self, task: TaskSpec, decision: Decision, digest: str,
               provider: llm.Provider | None, overrides: Mapping[str, int] | None,
               start: float) -> GeneratedKernel:
        """Cache hit or generate-check-compile-seal for one provider (``None``:
        the template). Raises :class:`Rejected` for an LLM candidate."""
        entry = entry_name(task.kind, task.dtype)
        version = template_version(task.kind)
        if provider is None:
            name, model, label = "template", None, "TEMPLATE"
        else:
            name, model = provider.name, provider.model
            label = LABELS.get(name, provider.label)
            # where its spot check ran is part of an answer's key: a kernel
            # checked in emulation on a host without a GPU is checked again
            # on the device by a host with one that reads the same cache
            # and so is the code of the checks it passed: an answer a later
            # Gate 2a, 2c or spot check would refuse is not served from a
            # cache it entered under an earlier one
            version = (f"{version}.p{llm.PROMPT_VERSION}"
                       f".spot-{spotcheck.resolve_runner(self.spot_runner)}"
                       f".checks-{checks_digest()}")
        if overrides:
            version += "." + ",".join(f"{k}={v}" for k, v in sorted(
                overrides.items()))
        arch, options, compiler = (f"compute_{self.arch}", self.options,
                                   self._compiler_name())
        key = cache_key(digest, name, model, version, arch=arch, options=options,
                        compiler=compiler)
        if self.use_cache:
            hit, verdict = self.cache.get(key, arch=arch, options=options,
                                          compiler=compiler)
            if hit is not None:
                return GeneratedKernel(
                    source=hit.source, kernel_name=entry, provider=name, model=model,
                    label=label, arch=hit.arch, options=hit.options,
                    ptx=hit.binary.decode(), verdicts={"gate2b": verdict},
                    cached=True, cache_key=key,
                    seconds=time.perf_counter() - start)
        spot = None
        if provider is None:
            source = render_template(task, decision, overrides)
        else:
            source = self._ask(provider, task, decision)
        gate2a = scan_source(source, entry, options=options)
        gate_opts = check_compile_options(list(options))
        if not (gate2a.accepted and gate_opts.accepted):
            bad = gate2a if not gate2a.accepted else gate_opts
            self._reject(provider, f"Gate 2a: {bad.summary()}", "gate2a")
        if provider is not None:
            source, gate2a = self._canonical(provider, source, entry)
        try:
            if provider is None:
                ptx = nvrtc.compile_ptx(source, f"{entry}.cu", self.arch,
                                        options[2:])
            else:
                ptx = isolation.compile_ptx_isolated(
                    source, f"{entry}.cu", self.arch, options[2:],
                    include_dir=nvrtc.default_include_dir())
        except nvrtc.CompileError as exc:
            self._reject(provider, "NVRTC: " + _first_error(str(exc)), "nvrtc")
        except isolation.IsolationError as exc:
            self._reject(provider, f"sandbox: {exc}", "sandbox")
        if provider is not None:
            gate2c = check_ptx(ptx, entry, int(decision.block))
            if not gate2c.accepted:
                self._reject(provider, f"Gate 2c: {gate2c.summary()}", "ptx")
            tile = tunables(task, decision).get("MATMUL_TILE", 16)
            try:
                spot = spotcheck.spot_check(source, task, decision,
                                            self.spot_runner, tile=tile,
                                            sandboxed=True, ptx=ptx)
            except EmulationError as exc:
                text = str(exc)
                said = [ln.strip() for ln in text.splitlines()
                        if ln.startswith("driver: ")]
                self._reject(provider, "spot check did not run: "
                             + (said[0] if said else _first_error(text)), "spot")
            if not spot.passed:
                self._reject(provider, f"spot check failed on {spot.task}: max "
                             f"|error| {spot.max_abs_error:.3g} above tolerance "
                             f"({spot.runner})", "spot")
        resources = None
        if self.measure_resources or provider is not None:
            try:
                resources = nvrtc.ptxas_resources(ptx, self.arch) \
                    if provider is None else \
                    isolation.ptxas_resources_isolated(ptx, self.arch)
            except nvrtc.CompileError as exc:
                if provider is not None:  # a module no GPU would load
                    self._reject(provider, "ptxas: " + _first_error(str(exc)),
                                 "resources")
                log.info("ptxas could not measure %s: %s", entry, exc)
            except isolation.IsolationError as exc:
                self._reject(provider, f"sandbox: {exc}", "sandbox")
        if provider is not None and resources:
            self._check_resources(provider, resources)
        verdicts = {"gate2a": gate2a, "gate2a.options": gate_opts}
        if provider is not None:
            verdicts["gate2c"] = gate2c
        if self.use_cache:
            sealed = self.cache.put(key, source, ptx, options, arch, compiler)
            verdicts["gate2b"] = self.cache.seal.verify(sealed, key)
        return GeneratedKernel(
            source=source, kernel_name=entry, provider=name, model=model,
            label=label, arch=arch, options=options, ptx=ptx, verdicts=verdicts,
            resources=resources, spot=spot, cached=False, cache_key=key,
            seconds=time.perf_counter() - start)

    def _canonical(self, provider: llm.Provider, source: str,
                   entry: str) -> tuple[str, Verdict]:
        """Untrusted ``source`` as every compiler will take it
        (:func:`lib.codegen.isolation.canonicalise`), scanned again by Gate 2a:
        the text NVRTC, the sandboxed spot check and the cache all use."""
        try:
            text = isolation.canonicalise(source, self.arch)
        except isolation.IsolationError as exc:
            self._reject(provider, f"sandbox: {exc}", "sandbox")
        verdict = scan_source(text, entry, options=self.options)
        if not verdict.accepted:
            self._reject(provider, f"Gate 2a (as the compilers see it): "
                         f"{verdict.summary()}", "gate2a.compiled")
        return text, verdict

    def _check_resources(self, provider: llm.Provider,
                         usage: Mapping[str, Mapping[str, int]]) -> None:
        """Refuse a kernel any of whose functions has a stack or spills per
        thread (ptxas's own report, per function: a device function's frame
        is not in its caller's figure) above :data:`MAX_STACK_BYTES`: a huge
        local array would exhaust device memory at launch. (Recursion, whose
        depth no figure bounds, Gate 2c refuses.)"""
        for name, one in usage.items():
            stack = one.get("stack_bytes", 0)
            spills = one.get("spill_store_bytes", 0)
            if stack > MAX_STACK_BYTES or spills > MAX_STACK_BYTES:
                self._reject(provider, f"resources: {name}: {stack} B stack and "
                             f"{spills} B spills per thread (limit "
                             f"{MAX_STACK_BYTES} B)", "resources")

    def _ask(self, provider: llm.Provider, task: TaskSpec,
             decision: Decision) -> str:
        prompt = llm.build_prompt(task, decision)
        try:
            answer = provider.ask(prompt, task)
        except CodegenError as exc:
            raise Rejected(str(exc)) from None
        except Exception as exc:  # any SDK or transport error: fall back
            raise Rejected(f"request failed: {type(exc).__name__}: "
                           f"{str(exc)[:160]}") from None
        code, why = llm.extract_code(answer)
        if code is None:
            raise Rejected(why)
        return code

    @staticmethod
    def _reject(provider: llm.Provider | None, reason: str, check: str) -> None:
        if provider is None:  # the template is the fallback: nothing is left
            raise CodegenError(f"the template kernel failed: {reason}")
        raise Rejected(reason, check)

    def _compiler_name(self) -> str:
        if not self._compiler:
            self._compiler = nvrtc.compiler_name()
        return self._compiler


def _first_error(log_text: str, lines: int = 3) -> str:
    """The first lines of a compiler log that say ``error``, joined."""
    found = [ln.strip() for ln in log_text.splitlines() if "error" in ln.lower()]
    return " | ".join((found or log_text.strip().splitlines()[:1])[:lines])[:300]


def _replace(kernel: GeneratedKernel, **changes: Any) -> GeneratedKernel:
    from dataclasses import replace

    return replace(kernel, **changes)


def generate(task: TaskSpec, decision: Decision,
             provider: str | llm.Provider = "template", *,
             model: str | None = None, home: Path | None = None,
             **options: Any) -> GeneratedKernel:
    """One request through a :class:`CodeGenerator` (cache under ``home`` if
    given, else ``$GPUHIVE_HOME``); ``options`` go to the generator."""
    cache = KernelCache(home / "kernels", home / "keys" / "seal.key") if home \
        else None
    return CodeGenerator(cache=cache, **options).generate(task, decision, provider,
                                                          model=model)
