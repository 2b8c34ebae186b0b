"""Where every layer of Gate 2a puts its findings.

:class:`Report` collects :class:`~lib.security.verdict.Violation` objects for
one scan (of a source or of a list of compile options); :data:`GATE` is the
gate name every Gate 2a :class:`~lib.security.verdict.Verdict` carries.
"""

from __future__ import annotations

from lib.security.verdict import Violation

GATE = "gate2a"
#: At most this many violations are listed per check id (plus one summary).
MAX_PER_CHECK = 20


class Report:
    """Collects violations: deduplicated, at most MAX_PER_CHECK per check id."""

    def __init__(self) -> None:
        self.found: list[Violation] = []
        self._seen: set[tuple] = set()
        self._count: dict[str, int] = {}

    def add(self, check: str, message: str, line: int | None) -> None:
        """Record one finding; ``line`` is the 1-based source line or ``None``."""
        key = (check, message, line)
        if key in self._seen:
            return
        self._seen.add(key)
        n = self._count.get(check, 0) + 1
        self._count[check] = n
        if n <= MAX_PER_CHECK:
            self.found.append(Violation(check, message, line))

    def violations(self) -> tuple[Violation, ...]:
        """The listed findings in the order found, then one summary per check
        id whose findings went over MAX_PER_CHECK."""
        more = [
            Violation(c, f"{n - MAX_PER_CHECK} more {c} violations not listed")
            for c, n in self._count.items()
            if n > MAX_PER_CHECK
        ]
        return tuple(self.found + more)
