"""The gates: Gate 1 never trusts the policy; Gate 2 never trusts generated code.

- :func:`check_decision` -- Gate 1, validity and feasibility of a Decision.
- :class:`Verdict`, :class:`Violation` -- what every gate returns.
"""

from lib.security.gate1 import check_decision
from lib.security.verdict import Verdict, Violation

__all__ = ["Verdict", "Violation", "check_decision"]
