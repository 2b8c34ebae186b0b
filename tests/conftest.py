"""Shared fixtures, the gpu marker's skip rule and the serial marker's guard.

``make test`` runs the suite in two phases: every test not marked ``serial``
on several workers side by side (pytest-xdist), then the ``serial`` tests
alone. A test is ``serial`` when it measures this computer in its own process
-- starts the cpu backend's workers, a Dask cluster or an induced load, or
reads the cores' load and capacity from ``/proc`` -- because the tests beside
it would show up in what it measures; and so is the execution chapter's run on
``local-cpu``, which measures in its kernel. (Tests that only start a measuring
command, and check what it prints but not what it measured, run side by side.)
On a worker, :func:`_measures_alone` makes such a call from an unmarked test
fail at once with the mark to add, so a missing mark fails every run rather
than now and then; and a ``serial`` test collected on a worker (``pytest -n 2``
without ``-m "not serial"``) is skipped with the reason, not measured beside
the others.

Each test file has a ``GPUHIVE_HOME`` of its own (:func:`_home_of_its_own`):
what one file leaves there -- a notebook's characterisation of ``local-cpu``,
a saved calibration, a history -- changes what the machine's profile and
cost model say, and the files run in whatever order, on whichever worker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from hypothesis import settings

from lib.platform.dask_cluster import close_all
from lib.platform.machines import load_machine

_HOME: list[str] = []

# The suite's property tests draw the same examples on every run (a seed from
# each test's name), so CI passes or fails on the code, not on the draw; a
# property that fails does so every time, and can be reproduced. To draw
# fresh examples instead: HYPOTHESIS_PROFILE=explore make test.
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


def pytest_configure(config):
    """Keep tests away from the user's calibration, keys and kernel cache, and
    give the session's ``tmp_path`` folders one temporary folder of its own
    (two sessions at once never share one; outside the project, whose book
    a test must not find above its folder), removed when the session ends,
    instead of pytest's folders kept in ``/tmp`` after it."""
    _HOME.append(tempfile.mkdtemp(prefix="gpuhive-test-home-"))
    os.environ["GPUHIVE_HOME"] = _HOME[-1]
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="gpuhive-pytest-")
        _HOME.append(config.option.basetemp)


def pytest_unconfigure(config):
    """Leave nothing behind: the test home and the session's ``tmp_path``
    folders go with the session (after the Dask clusters tests left open,
    whose scratch lives in the home)."""
    close_all()
    while _HOME:
        shutil.rmtree(_HOME.pop(), ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    # the notebook smoke runs first: they are the longest, and side by side
    # (make test's first phase) the workers then finish close together
    items.sort(key=lambda item: "notebook" not in item.keywords)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # beside other tests a measurement measures them too: skip, and say where
        # the test runs (the second phase of make test, or pytest -m serial)
        for item in items:
            if item.get_closest_marker("serial"):
                item.add_marker(pytest.mark.skip(
                    reason="serial: it measures this computer, so it runs alone "
                           "(make test's second phase, or pytest -m serial)"))
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if not gpu_items:
        return
    from lib.platform.cudastack import probe

    found = probe()
    if found.usable:
        return
    reason = "no usable CUDA: " + "; ".join(found.reasons)
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


#: What measures this computer in a test's own process.
_MEASURING = (
    "lib.execution.cpu.CpuBackend.start",
    "lib.execution.load.CoreLoad.start",
    "lib.platform.dask_cluster.DaskCluster.__init__",
    "lib.platform.telemetry._proc_stat_times",
    "lib.platform.telemetry.runnable_look",
)


@pytest.fixture(autouse=True, scope="module")
def _home_of_its_own(tmp_path_factory):
    """A fresh ``GPUHIVE_HOME`` for each test file, the session's again after
    it. MEASURED why: with one home for the session, the characterisation
    and cost-model chapters' smoke runs left a ``local-cpu`` profile there,
    and a later file on the same worker then predicted the learned policy at
    1.066 of the optimum on idle ``local-cpu``, where the profile a fresh home
    gives keeps it within 1.05."""
    before = os.environ.get("GPUHIVE_HOME")
    home = tmp_path_factory.mktemp("home")
    os.environ["GPUHIVE_HOME"] = str(home)
    try:
        yield home
    finally:
        if before is None:
            os.environ.pop("GPUHIVE_HOME", None)
        else:
            os.environ["GPUHIVE_HOME"] = before


@pytest.fixture(autouse=True)
def _measures_alone(request, monkeypatch):
    """On an xdist worker, an unmarked test that measures this computer fails
    at its first measuring call (see the module's docstring)."""
    if (not os.environ.get("PYTEST_XDIST_WORKER")
            or request.node.get_closest_marker("serial")):
        return
    for target in _MEASURING:
        def refuse(*args, _what=target, **kwargs):
            raise RuntimeError(
                f"{request.node.nodeid} measures this computer ({_what}) while "
                "other tests run beside it: mark it @pytest.mark.serial")
        monkeypatch.setattr(target, refuse)


@pytest.fixture(scope="session")
def fresh_python():
    """Run Python source in a fresh interpreter (this one has loaded every
    module already) and return what it printed; a failure fails the test
    with its stderr. For checks of what an import loads."""
    def run(code: str) -> str:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout
    return run


@pytest.fixture(scope="session")
def hetero4():
    return load_machine("hetero-4")


@pytest.fixture(scope="session")
def local_cpu():
    return load_machine("local-cpu")
