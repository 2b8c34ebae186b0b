"""Every policy by name: the one vocabulary the runtime, the CLI and the
evaluation share.

``rl`` is the shipped learned policy, the six cheap baselines come from
:data:`lib.policies.baselines.BASELINES`, and ``oracle`` is the exhaustive
optimum under the cost model. :func:`make_policy` also takes the path of a
policy file (``.npz``), so a policy of one's own is named the same way.

The learned policy and the optimum are imported when one is made, not with
this module: their modules and what they import (Numba, the policy's fast
path, the optimum's search) took a third of a second or more here, which a
command that only lists the names (``gpuhive --help``) does not need.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lib.policies.baselines import BASELINES, Policy, ProportionalToPeak


def default_policy() -> Policy:
    """The shipped learned policy (one for every machine), or
    proportional-to-peak where no policy file ships.

    Raises:
        lib.learners.ppo.PolicyFormatError: a shipped file that cannot be
            loaded (never silently replaced by a baseline).
    """
    from lib.policies.learned import DEFAULT_POLICY, load_policy

    if not DEFAULT_POLICY.is_file():
        return ProportionalToPeak()
    return load_policy()


def oracle() -> Policy:
    """The exhaustive optimum under the cost model
    (:class:`lib.policies.oracle.Oracle`)."""
    from lib.policies.oracle import Oracle

    return Oracle()


#: Every policy by name: the learned one (``rl``), the six cheap baselines and
#: the exhaustive optimum (``oracle``). Each value makes a fresh policy.
POLICIES: dict[str, Callable[[], Policy]] = {
    "rl": default_policy, **BASELINES, "oracle": oracle}


def make_policy(name: str, seed: int = 0) -> Policy:
    """A policy by name (see :data:`POLICIES`) or by the path of a policy file;
    ``random`` takes the seed.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
        lib.learners.ppo.PolicyFormatError: a policy file that cannot be loaded
            (a ValueError too; the message names the file).
    """
    if name in POLICIES:
        return POLICIES[name](seed) if name == "random" else POLICIES[name]()
    if name.endswith(".npz") or Path(name).is_file():
        from lib.policies.learned import load_policy

        return load_policy(name)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}, "
                     "or the path of a policy file (.npz)")
