"""Cost-model parameters on disk: one JSON per machine under the home folder.

:func:`save_params` writes ``<home>/calibration/<machine>.json`` atomically
(``<home>`` is ``$GPUHIVE_HOME`` or ``~/.gpuhive``); :func:`load_params` reads
it back and refuses a malformed file with one line naming it;
:func:`params_for` is what every consumer calls: the calibrated parameters
where some were saved, else the uncalibrated defaults.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from lib.costmodel.model import CostParams, default_params
from lib.storage import calibration_path, write_json_atomic

SCHEMA = "gpuhive.calibration/1"


class _Report(Protocol):
    """What :func:`save_params` stores of a calibration report."""

    def to_json(self) -> dict[str, Any]: ...


class CalibrationError(ValueError):
    """Runs or files calibration cannot use (the message names the culprit)."""



def params_to_json(params: CostParams) -> dict[str, Any]:
    """CostParams as nested JSON: ``{"compute_eff": {"cpu": {"matmul": 0.5}}}``."""
    def nest(table: Mapping[tuple[str, str], float]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (dk, k), v in sorted(table.items()):
            out.setdefault(dk, {})[k] = float(v)
        return out
    return {"compute_eff": nest(params.compute_eff),
            "memory_eff": nest(params.memory_eff),
            "launch_s": {k: float(v) for k, v in sorted(params.launch_s.items())},
            "link_scale": {k: float(v) for k, v in sorted(params.link_scale.items())},
            "contention": {k: float(v) for k, v in sorted(params.contention.items())},
            "sched_wait": {k: float(v) for k, v in sorted(params.sched_wait.items())},
            "host_s": {k: float(v) for k, v in sorted(params.host_s.items())},
            "cache_bw": {k: float(v) for k, v in sorted(params.cache_bw.items())},
            "corun": {k: float(v) for k, v in sorted(params.corun.items())},
            "cache_size": {k: float(v) for k, v in sorted(params.cache_size.items())},
            "latency_scale": {k: float(v)
                              for k, v in sorted(params.latency_scale.items())},
            "burst_s": {k: float(v) for k, v in sorted(params.burst_s.items())},
            "fixed_s": nest(params.fixed_s),
            "source": params.source, "fitted": list(params.fitted)}


def params_from_json(obj: Mapping[str, Any], where: str = "params") -> CostParams:
    """Inverse of :func:`params_to_json`; raises CalibrationError naming the field."""
    def number(v: Any, name: str, off: bool = False) -> float:
        """A positive number; ``off``: 0 allowed too (a term left off)."""
        if isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not math.isfinite(v) or v < 0 or (v == 0 and not off):
            raise CalibrationError(f"{where}: {name} must be a "
                                   f"{'non-negative' if off else 'positive'} "
                                   f"number, got {v!r}")
        return float(v)

    try:
        tables = {}
        for t in ("compute_eff", "memory_eff"):
            tables[t] = {(dk, k): number(v, f"{t}.{dk}.{k}")
                         for dk, row in obj[t].items() for k, v in row.items()}
        for t in ("launch_s", "link_scale"):
            tables[t] = {dk: number(v, f"{t}.{dk}") for dk, v in obj[t].items()}
        # absent from files written before it was fitted: the fair share;
        # below 1 in files fitted before the fit's bound (lib.costmodel.fit
        # says why): read as 1, as a fit of the same runs now gives it
        tables["contention"] = {dk: max(1.0, number(v, f"contention.{dk}"))
                                for dk, v in obj.get("contention", {}).items()}
        # absent likewise: no wait for the scheduler
        # (0 where the runs could not tell them: the term stays off)
        tables["sched_wait"] = {dk: number(v, f"sched_wait.{dk}", off=True)
                                for dk, v in obj.get("sched_wait", {}).items()}
        # and no serial cost of the host per shard
        tables["host_s"] = {dk: number(v, f"host_s.{dk}", off=True)
                            for dk, v in obj.get("host_s", {}).items()}
        # absent from files before the cache and co-running terms: both off
        tables["cache_bw"] = {dk: number(v, f"cache_bw.{dk}")
                              for dk, v in obj.get("cache_bw", {}).items()}
        tables["corun"] = {dk: number(v, f"corun.{dk}", off=True)
                           for dk, v in obj.get("corun", {}).items()}
        # absent from files before the cache's size was fitted: the reported
        # size (0 where chosen: no run behaved as if its data stayed cached)
        tables["cache_size"] = {dk: number(v, f"cache_size.{dk}", off=True)
                                for dk, v in obj.get("cache_size", {}).items()}
        # and before the link's latency was: the profile's
        tables["latency_scale"] = {dk: number(v, f"latency_scale.{dk}")
                                   for dk, v in obj.get("latency_scale", {}).items()}
        # and before a woken shard's free run was: every shard feels the load
        # (so too at 0, written where the runs under load could not tell it)
        tables["burst_s"] = {dk: number(v, f"burst_s.{dk}", off=True)
                             for dk, v in obj.get("burst_s", {}).items()}
        # and before a kind's own fixed cost a shard was: none
        tables["fixed_s"] = {(dk, k): number(v, f"fixed_s.{dk}.{k}", off=True)
                             for dk, row in obj.get("fixed_s", {}).items()
                             for k, v in row.items()}
        return CostParams(**tables, source=str(obj.get("source", "file")),
                          fitted=tuple(str(n) for n in obj.get("fitted", ())))
    except (KeyError, AttributeError, TypeError) as exc:
        raise CalibrationError(f"{where}: malformed ({exc!r})") from None


def save_params(machine_name: str, params: CostParams,
                report: _Report | None = None) -> Path:
    """Write the calibrated parameters (and their report) atomically.

    Returns:
        The path written, ``<home>/calibration/<machine>.json``.

    Raises:
        CalibrationError: ``params`` would not load back (a value the loader
            refuses, named); the file already there is left as it was.
    """
    table = params_to_json(params)
    params_from_json(table, f"calibration of {machine_name} (not saved)")
    obj = {"schema": SCHEMA, "machine": machine_name,
           "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "params": table,
           "report": report.to_json() if report is not None else None}
    return write_json_atomic(obj, calibration_path(machine_name))


def load_params(machine_name: str) -> CostParams | None:
    """The saved calibrated parameters of a machine, or None if never calibrated.

    Raises:
        CalibrationError: the file exists but cannot be read as parameters.
    """
    path = calibration_path(machine_name)
    if not path.is_file():
        return None
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CalibrationError(f"{path}: not readable ({exc})") from None
    hit = _LOADED.get(str(path))
    if hit is not None and hit[0] == raw:
        return hit[1]
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise CalibrationError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(obj, Mapping) or obj.get("schema") != SCHEMA:
        raise CalibrationError(f"{path}: not a {SCHEMA} file")
    params = params_from_json(obj.get("params"), str(path))
    _LOADED[str(path)] = (raw, params)
    return params


#: The parameters last read from each file, with the bytes they were read
#: from: every decision under measured telemetry asks for them (twice), and
#: the file carries its calibration report, so parsing and checking it each
#: time grows with the runs calibrated on (MEASURED on this computer: 155 us
#: for a file of 23 kB, against 12 us to read it and find it unchanged). The
#: file is still read each time, so an edit, a recalibration or a tampered
#: byte is seen at once.
_LOADED: dict[str, tuple[bytes, CostParams]] = {}


def params_for(machine_name: str) -> CostParams:
    """The machine's calibrated parameters where ``gpuhive calibrate`` saved
    some, else the uncalibrated defaults (``params.source`` says which)."""
    return load_params(machine_name) or default_params()


