"""The gates: Gate 1 never trusts the policy; Gate 2 never trusts generated code.

- :func:`check_decision` -- Gate 1, validity and feasibility of a Decision.
- :func:`scan_source`, :func:`check_compile_options` -- Gate 2a, static scan of
  CUDA source and of its compile options.
- :func:`check_ptx` -- Gate 2c, the scan of an untrusted kernel's compiled PTX.
- :class:`Seal` -- Gate 2b, the HMAC integrity seal of cached kernels.
- :class:`Verdict`, :class:`Violation` -- what every gate returns.
"""

from lib.security.gate1 import check_decision
from lib.security.ptx import check_ptx
from lib.security.scan import check_compile_options, scan_source
from lib.security.seal import Seal, SealedEntry, SealError
from lib.security.verdict import Verdict, Violation

__all__ = [
    "Seal", "SealError", "SealedEntry", "Verdict", "Violation",
    "check_compile_options", "check_decision", "check_ptx", "scan_source",
]
