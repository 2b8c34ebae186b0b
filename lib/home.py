"""Where GPUHive keeps what it learns on a machine.

``$GPUHIVE_HOME`` if set, else ``~/.gpuhive``. Below it: ``characterisation/``
and ``calibration/`` (one JSON per machine), ``kernels/`` (the sealed kernel
cache) and ``keys/`` (the seal's key, mode 0600).
"""

from __future__ import annotations

import os
from pathlib import Path


def gpuhive_home() -> Path:
    """``$GPUHIVE_HOME`` if set, else ``~/.gpuhive``."""
    env = os.environ.get("GPUHIVE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".gpuhive"
