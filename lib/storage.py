"""Where GPUHive keeps what it learns on a machine, and the one way it writes.

``$GPUHIVE_HOME`` if set, else ``~/.gpuhive``. Below it:

- ``characterisation/<machine>.json`` -- what ``gpuhive characterise`` measured;
- ``calibration/<machine>.json`` -- the cost model's fitted parameters;
- ``history/<machine>.json`` -- what the runtime learned from its runs;
- ``kernels/`` -- the sealed kernel cache (Gate 2b), ``keys/`` its key (0600).

A machine's files are named after it, or where its name cannot name a file (a
Dask cluster's ``dask://host:8786``), after a stem of it (:func:`machine_file`).

Every file is written by :func:`write_atomic`: a temporary file in the same
folder, fsync, ``os.replace``, fsync of the folder. A reader (or a crash) sees
the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


class StorageError(ValueError):
    """A name that cannot name a file under the home folder."""


def gpuhive_home() -> Path:
    """``$GPUHIVE_HOME`` if set, else ``~/.gpuhive``."""
    env = os.environ.get("GPUHIVE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".gpuhive"


def safe_name(machine_name: str) -> str:
    """``machine_name`` if it can name one file in one folder (no separators,
    no leading dot, not empty); :class:`StorageError` naming it otherwise."""
    if not machine_name or any(c in machine_name for c in "/\\\0") \
            or machine_name.startswith("."):
        raise StorageError(f"machine name {machine_name!r} cannot name a file")
    return machine_name


def file_stem(machine_name: str) -> str:
    """A file name for any machine name, Dask addresses included
    (``dask://host:8786`` -> ``dask_host_8786``); plain names are unchanged."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in machine_name)
    return safe_name(stem.replace("___", "_").strip("_") or "_")


def machine_file(machine_name: str) -> str:
    """The file name (without ``.json``) a machine's characterisation and
    calibration are kept under: the name itself where it can name a file
    (:func:`safe_name`), else its :func:`file_stem` (a Dask cluster's
    ``dask://host:8786`` is ``dask_host_8786``). A name no file can be made
    of, even so (``../x``), is a :class:`StorageError` naming it."""
    try:
        return safe_name(machine_name)
    except StorageError:
        pass
    try:
        return file_stem(machine_name)
    except StorageError:
        raise StorageError(f"machine name {machine_name!r} cannot name a file") \
            from None


def calibration_path(machine_name: str) -> Path:
    """``<home>/calibration/<machine>.json`` (:func:`machine_file`)."""
    return gpuhive_home() / "calibration" / f"{machine_file(machine_name)}.json"


def characterisation_path(machine_name: str) -> Path:
    """``<home>/characterisation/<machine>.json`` (where characterise writes;
    :func:`machine_file`)."""
    return gpuhive_home() / "characterisation" / f"{machine_file(machine_name)}.json"


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (a rename is durable once its folder is)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring).

    Args:
        path: the file; its folder is created if missing.
        data: the whole new content.
        mode: permission bits for the new file (``mkstemp`` gives 0600).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                               dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write_json_atomic(obj: Any, path: str | Path, *, indent: int = 1,
                      default: Any = None) -> Path:
    """:func:`write_atomic` of ``obj`` as JSON (no NaN or infinity)."""
    text = json.dumps(obj, indent=indent, allow_nan=False, default=default) + "\n"
    return write_atomic(path, text.encode())
