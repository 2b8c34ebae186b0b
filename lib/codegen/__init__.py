"""The code-gen plane: CUDA source for a (task, decision), through Gate 2.

- :func:`generate`, :class:`CodeGenerator` -- serve a :class:`GeneratedKernel`
  from the template or an LLM provider, behind the sealed cache.
- :func:`render_template`, :func:`single_kernel` -- the template provider's
  specialisation of ``kernels/<kind>.cu``.
- :mod:`lib.codegen.llm` (providers, prompt, code-block extraction),
  :mod:`lib.codegen.cache` (the sealed cache), :mod:`lib.codegen.nvrtc`
  (NVRTC and headers), :mod:`lib.codegen.emulate` and
  :mod:`lib.codegen.spotcheck` (the CPU emulation harness and the numerical
  check).
- :func:`register_kind` (:mod:`lib.codegen.kinds`) -- a user's own kind, its
  kernel through Gate 2a, joins every plane.
"""

from lib.codegen.cache import KernelCache, cache_key, gpuhive_home
from lib.codegen.kinds import KindError, register_kind
from lib.codegen.llm import PROVIDERS, build_prompt, extract_code, make_provider
from lib.codegen.plane import (
    CodeGenerator,
    GeneratedKernel,
    generate,
)
from lib.codegen.specialise import (
    CodegenError,
    render_template,
    single_kernel,
    template_version,
)

__all__ = [
    "PROVIDERS", "CodeGenerator", "CodegenError", "GeneratedKernel", "KernelCache",
    "KindError", "build_prompt", "cache_key", "extract_code", "generate",
    "gpuhive_home", "make_provider", "register_kind", "render_template",
    "single_kernel", "template_version",
]
