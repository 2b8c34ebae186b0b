"""Smoke runs of every notebook through papermill (budget="smoke").

Each run executes the notebook as `make book` would, with figures and records
sent to a temporary folder, then checks the recorded headline numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lib.book import execute_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("m*.ipynb"))

pytestmark = pytest.mark.notebook


@pytest.fixture
def book_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHIVE_RECORD_DIR", str(tmp_path / "records"))
    monkeypatch.setenv("GPUHIVE_FIGURES_DIR", str(tmp_path / "figures"))
    return tmp_path


def _smoke(nb: Path, tmp: Path, machine: str = "hetero-4", backend: str = "model"):
    execute_notebook(nb, tmp / "out" / nb.name, machine=machine, backend=backend,
                     budget="smoke", seed=0, cwd=ROOT, timeout=600)
    record = json.loads((tmp / "records" / f"{nb.stem}.json").read_text())
    figures = sorted((tmp / "figures" / machine).glob(f"{nb.stem[:3]}*.png"))
    return record, figures


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_notebook_smoke_run(book_env, nb):
    record, figures = _smoke(nb, book_env)
    assert record["machine"] == "hetero-4" and record["budget"] == "smoke"
    executed = json.loads((book_env / "out" / nb.name).read_text())
    tags = [c.get("metadata", {}).get("tags", []) for c in executed["cells"]]
    # the values the page was built with appear once: papermill's cell only
    assert sum("parameters" in t or "injected-parameters" in t for t in tags) == 1
    assert figures, f"{nb.stem} saved no figure under figures/hetero-4/"
    values = record["values"]
    if nb.stem == "m01-contract":
        assert values["hash_matches"] and values["round_trip"]
        assert values["parse_errors_caught"] == values["parse_cases"]
        assert values["predicted_speedup_proportional_over_equal"] > 1.0
    if nb.stem == "m02-security":
        assert values["adversarial_cases"] >= 60 and values["families"] >= 20
        assert values["benign_controls"] >= 20
        assert values["false_positive_rate"] == 0.0
    if nb.stem == "m03-characterisation":
        assert values["measured_runs"] > 0 and values["all_measured_tagged"]
    if nb.stem == "m04-cost-model":
        assert values["optimum_never_slower"]
        assert values["optimum_geomean_speedup_over_equal"] > 1.25
        assert 0 <= values["median_ape"] and -1 <= values["spearman"] <= 1
    if nb.stem == "m09-evaluation":
        assert set(values["targets"]) == {f"T{i}" for i in range(1, 8)}
        assert values["label"] == "PREDICTED (model)"
        assert abs(values["table4"]["oracle"]["ratio_to_optimum"] - 1.0) < 1e-9
        # task by task under load; on the model nothing beats the optimum
        h2h = values["learned_vs_optimum"]
        assert h2h["states"] == ["busy"] and h2h["ratio"] <= 1.0 + 1e-9
        assert h2h["wins"] + h2h["losses"] + h2h["ties"] == h2h["tasks"] > 0
    if nb.stem == "m10-own-kind":
        assert values["registered"] == "softmax" and values["cpu_verified"]
        assert values["emulated_kernel_ok"] in (True, None)  # None: no compiler
    if nb.stem == "m08-execution":
        assert values["run_verified"] and values["cpu_verified"]
        assert values["run_label"] == "PREDICTED (model)"
        assert values["cpu_measured"] and values["failure_caught"]


@pytest.mark.serial
def test_execution_notebook_on_local_cpu_measures(book_env):
    nb = ROOT / "notebooks" / "m08-execution.ipynb"
    record, figures = _smoke(nb, book_env, machine="local-cpu", backend="cpu")
    assert record["backend"] == "cpu" and figures
    assert record["values"]["run_verified"] and record["values"]["run_measured"]
    # the calibrated model scored on runs taken with one core loaded (induced)
    assert record["values"]["under_load_runs"] > 0
    assert record["values"]["under_load_median_ape_pct"] >= 0
    assert any(f.name == "m08-under-load.png" for f in figures)
    # the same task alone on each core: the characterisation's plan runs every
    # single-device task on both, so there are pairs, each a measured ratio
    assert record["values"]["alone_tasks"] > 0
    assert all(r > 0 for r in record["values"]["alone_slowdowns"])
    assert any(f.name == "m08-alone.png" for f in figures)
    executed = (book_env / "out" / nb.name).read_text()
    assert "runs that used the loaded core the median APE is" in executed
    # the agent on the cpu backend read the cores before it decided
    assert "telemetry: MEASURED local-cpu, capacity " in executed


def test_the_books_kernel_talks_encrypted_where_it_can(book_env, capfd):
    """ipykernel 7 declares CurveZMQ in the kernelspec and warns, once per
    notebook, when it runs over TCP in plain text; the book starts its
    kernels with transport encryption on, so the warning is not printed."""
    import zmq
    from jupyter_client.kernelspec import KernelSpecManager

    from lib.book.build import _kernel_manager_class
    from lib.book.pages import KERNEL_NAME

    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    if not (zmq.has("curve")
            and "curve" in (spec.metadata or {}).get("supported_encryption", ())):
        pytest.skip("this pyzmq or kernelspec offers no CurveZMQ")
    assert _kernel_manager_class() is not None
    _smoke(NOTEBOOKS[0], book_env)
    assert "without encryption" not in capfd.readouterr().err
