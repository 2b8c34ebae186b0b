"""Shared fixtures and the gpu marker's skip rule."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from lib.platform.machines import load_machine

_HOME: list[str] = []


def pytest_configure(config):
    """Keep tests away from the user's calibration, keys and kernel cache."""
    _HOME.append(tempfile.mkdtemp(prefix="gpuhive-test-home-"))
    os.environ["GPUHIVE_HOME"] = _HOME[-1]


def pytest_unconfigure(config):
    """Leave nothing behind in /tmp: the test home goes with the session."""
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
