"""``gpuhive server-setup``: the steps it lists, and its environment check run
against the recorded NVML (a GPU server's answers, replayed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lib.cli import server_setup
from lib.platform.cudastack import CudaProbe
from lib.platform.telemetry import RecordedNvml

RECORDING = Path(__file__).parent / "data" / "nvml_snapshot.json"


def _gpuhive(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lib", *args], capture_output=True,
                          text=True, timeout=120)


def test_dry_run_lists_every_step_and_runs_nothing(tmp_path):
    p = _gpuhive("server-setup", "--dry-run", "--json", "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    names = [s["step"] for s in json.loads(p.stdout)["steps"]]
    assert names == ["environment", "doctor", "gpu-proof", "characterise",
                     "calibrate"]
    assert not (tmp_path / "o").exists()


def test_without_a_gpu_it_stops_at_the_environment_and_writes_the_report(tmp_path):
    out = tmp_path / "o"
    p = _gpuhive("server-setup", "--out", str(out))
    report = json.loads((out / "server-setup.json").read_text())
    if report["steps"]["environment"]["status"] == "ok":  # a real GPU server
        return
    assert p.returncode == 2
    assert report["all_ok"] is False
    assert {report["steps"][s]["status"] for s in
            ("doctor", "gpu-proof", "characterise", "calibrate")} == {"skipped"}


def _probe(**over) -> CudaProbe:
    base = dict(cupy=True, driver=True, devices=2, nvrtc=True, nccl=True,
                reasons=())
    return CudaProbe(**{**base, **over})


def test_the_environment_check_reads_the_recorded_server(monkeypatch):
    monkeypatch.setattr("lib.platform.cudastack.probe", lambda: _probe())
    ok, summary, facts = server_setup.check_environment(RecordedNvml(RECORDING))
    assert ok, summary
    assert facts["nvml"]["devices"] == 2 and facts["nvml"]["healthy"] == [True, True]
    assert "NVML sees 2 device(s), 2 healthy" in summary


def test_the_environment_check_names_what_is_missing(monkeypatch):
    monkeypatch.setattr("lib.platform.cudastack.probe",
                        lambda: _probe(nccl=False, reasons=("NCCL missing",)))
    ok, summary, _ = server_setup.check_environment(RecordedNvml(RECORDING))
    assert not ok and "missing: NCCL" in summary and "environment.yml" in summary
