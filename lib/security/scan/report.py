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
    """Collects violations: deduplicated, at most ``limit`` per check id
    (MAX_PER_CHECK; ``None``: all, for a report merged into another)."""

    def __init__(self, limit: int | None = MAX_PER_CHECK) -> None:
        self.found: list[Violation] = []
        self.limit = limit
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
        if self.limit is None or n <= self.limit:
            self.found.append(Violation(check, message, line))

    def violations(self) -> tuple[Violation, ...]:
        """The listed findings in the order found, then one summary per check
        id whose findings went over the limit."""
        if self.limit is None:
            return tuple(self.found)
        more = [
            Violation(c, f"{n - self.limit} more {c} violations not listed")
            for c, n in self._count.items()
            if n > self.limit
        ]
        return tuple(self.found + more)
