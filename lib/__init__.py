"""GPUHive (RL-Split): decide how to spread one divisible CUDA task over devices.

The spine, top to bottom::

    policy.decide(task, machine, telemetry) -> Decision      (decision plane)
    security.check_decision(...)            -> Verdict       (Gate 1)
    execution backend .run(task, decision)  -> Result        (execution plane)

Start with :class:`lib.runtime.Agent`, or read :mod:`lib.contract` for the two
objects everything else exchanges.
"""

from lib.contract import ContractError, Decision, TaskSpec

__all__ = ["ContractError", "Decision", "TaskSpec", "__version__"]

__version__ = "0.1.0"
