"""The Gymnasium environment: split one task over a machine's devices, Eq. (2).

Importing this package registers ``GPUHive-Split-v0``::

    import gymnasium
    import lib.env

    env = gymnasium.make("GPUHive-Split-v0", machine="hetero-4", mode="task")

- :mod:`lib.policies.actions` -- observation and action spaces, masks, the
  decoder from action to decision;
- :mod:`lib.env.split` -- :class:`SplitEnv` (task and stream modes, the reward,
  the occupancy model) and its :class:`EnvConfig`;
- :mod:`lib.env.curriculum` -- :class:`Curriculum`, machine and task sampling,
  the held-out machines;
- :mod:`lib.env.batch` -- :class:`BatchModelEnv` and the steps/second benchmark.
"""

import gymnasium

from lib.contract import BLOCKS
from lib.env.batch import BatchModelEnv
from lib.env.curriculum import (
    DEFAULT_STAGES,
    HELD_OUT_MODELS,
    HELD_OUT_STAGE,
    HELD_OUT_TOPOLOGIES,
    TRAINING_MODELS,
    TRAINING_TOPOLOGIES,
    Curriculum,
    Stage,
    held_out_machines,
    sample_machine,
    sample_task,
    sample_task_and_split,
)
from lib.env.split import EnvConfig, SplitEnv, stream_seconds
from lib.policies.actions import (
    CHUNKS,
    OBS_KEYS,
    SLOTS,
    Decoder,
    action_from_decision,
    action_space,
    decision_from_action,
    equal_split_action,
    flatten_observation,
    masks,
    observation_space,
    sample_masked_action,
    sample_masked_actions,
    unflatten_observation,
)

ENV_ID = "GPUHive-Split-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="lib.env.split:SplitEnv")

__all__ = [
    "BLOCKS", "CHUNKS", "DEFAULT_STAGES", "ENV_ID", "HELD_OUT_MODELS",
    "HELD_OUT_STAGE", "HELD_OUT_TOPOLOGIES", "OBS_KEYS", "SLOTS", "TRAINING_MODELS",
    "TRAINING_TOPOLOGIES", "BatchModelEnv", "Curriculum", "Decoder",
    "EnvConfig", "SplitEnv", "Stage", "action_from_decision", "action_space",
    "decision_from_action", "equal_split_action",
    "flatten_observation", "held_out_machines", "masks", "observation_space",
    "sample_machine", "sample_masked_action", "sample_masked_actions",
    "sample_task", "sample_task_and_split", "stream_seconds", "unflatten_observation",
]
