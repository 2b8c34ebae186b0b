"""Shared fixtures and the gpu marker's skip rule."""

from __future__ import annotations

import pytest

from lib.platform.machines import load_machine


def pytest_configure(config):
    """Keep tests away from the user's calibration, keys and kernel cache."""
    import os
    import tempfile

    os.environ["GPUHIVE_HOME"] = tempfile.mkdtemp(prefix="gpuhive-test-home-")


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
