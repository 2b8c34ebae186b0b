"""The verdict every gate returns: accepted or not, and every violated check.

A gate never raises on bad input. It collects one :class:`Violation` per
broken check (a stable check id such as ``"form.type"`` or ``"token.asm"``, a
message that names the offending thing, and for source code the line) and
returns them all in a :class:`Verdict`, so a caller sees everything that is
wrong at once and a test can assert *which* check caught a case.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Violation:
    """One broken check.

    Attributes:
        check: stable id of the check, ``"<layer>.<name>"`` (e.g. ``"form.type"``,
            ``"feasibility.memory"``, ``"token.asm"``).
        message: one line naming the offending field, device or token.
        line: 1-based source line for Gate 2a findings, else ``None``.
    """

    check: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line is not None else ""
        return f"[{self.check}] {self.message}{where}"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one gate on one input.

    Attributes:
        gate: ``"gate1"``, ``"gate2a"`` or ``"gate2b"``.
        violations: every broken check, in the order found; empty when accepted.
        seconds: wall time the gate took (for the latency tables).
    """

    gate: str
    violations: tuple[Violation, ...] = field(default_factory=tuple)
    seconds: float = 0.0

    @property
    def accepted(self) -> bool:
        return not self.violations

    @property
    def checks(self) -> tuple[str, ...]:
        """The distinct check ids that fired, in order of first appearance."""
        return tuple(dict.fromkeys(v.check for v in self.violations))

    def summary(self) -> str:
        """One line: ``accepted`` or the first violation and how many more."""
        if self.accepted:
            return f"{self.gate}: accepted"
        more = len(self.violations) - 1
        tail = f" (+{more} more)" if more else ""
        return f"{self.gate}: rejected: {self.violations[0]}{tail}"
