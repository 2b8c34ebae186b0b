"""Shared fixtures and the gpu marker's skip rule."""

from __future__ import annotations

import os
import shutil
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


@pytest.fixture(scope="session")
def hetero4():
    return load_machine("hetero-4")


@pytest.fixture(scope="session")
def local_cpu():
    return load_machine("local-cpu")
