"""Checkpoints: a learner's state and the run's progress in one ``.npz`` file.

The file holds the learner's arrays (:meth:`TrainableLearner.state`) and a
``header`` array with JSON ``{"meta": <the learner's metadata>, "progress":
<the run's progress>}``. It is written to a temporary file and renamed, so an
interruption never leaves half a checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lib.learners import TrainableLearner


def save_checkpoint(path: Path, learner: TrainableLearner,
                    progress: Mapping[str, Any]) -> None:
    """Write the learner's state and ``progress`` (JSON) atomically."""
    arrays, meta = learner.state()
    text = json.dumps({"meta": meta, "progress": progress}, default=float)
    tmp = path.with_suffix(".tmp.npz")
    with tmp.open("wb") as fh:
        np.savez(fh, header=np.array(text), **arrays)
    tmp.replace(path)


def read_progress(path: Path) -> dict[str, Any]:
    """The progress saved in the checkpoint at ``path`` (the learner untouched)."""
    with np.load(path, allow_pickle=False) as npz:
        return json.loads(str(npz["header"]))["progress"]


def load_checkpoint(path: Path, learner: TrainableLearner) -> dict[str, Any]:
    """Restore ``learner`` from ``path``; return the saved progress."""
    with np.load(path, allow_pickle=False) as npz:
        head = json.loads(str(npz["header"]))
        arrays = {k: npz[k] for k in npz.files if k != "header"}
    learner.load_state(arrays, head["meta"])
    return head["progress"]
