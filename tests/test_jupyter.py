"""Interactive use: a headless Jupyter server on 127.0.0.1 answers and offers
the project's kernel, and a notebook runs through a kernel of that kernelspec
in this environment (what ``make lab`` gives a reader)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from lib.book import KERNEL_NAME

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


@pytest.fixture
def kernel_name():
    specs = KernelSpecManager().find_kernel_specs()
    if KERNEL_NAME not in specs:
        pytest.fail(f"no Jupyter kernel {KERNEL_NAME!r}: run make install")
    return KERNEL_NAME


def test_every_notebook_asks_for_the_project_kernel():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        spec = json.loads(path.read_text())["metadata"]["kernelspec"]
        assert spec["name"] == KERNEL_NAME, path.name


def test_the_kernel_runs_in_this_environment(kernel_name):
    spec = KernelSpecManager().get_kernel_spec(kernel_name)
    assert Path(spec.argv[0]).resolve() == Path(sys.executable).resolve()


@pytest.mark.slow
def test_a_headless_server_offers_the_kernel_and_a_notebook_runs_in_it(
        kernel_name, tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    exe = Path(sys.executable).with_name("jupyter")
    server = subprocess.Popen(
        [str(exe), "server", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={ROOT / 'notebooks'}",
         f"--ServerApp.runtime_dir={tmp_path / 'runtime'}",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config")})
    base = f"http://127.0.0.1:{port}/api"
    try:
        deadline, info = time.monotonic() + 60, None
        while info is None and time.monotonic() < deadline:
            try:
                info = _get(f"{base}?token={token}")
            except OSError:
                time.sleep(0.3)
        assert info is not None and "version" in info, "the server did not answer"
        specs = _get(f"{base}/kernelspecs?token={token}")["kernelspecs"]
        assert kernel_name in specs
        contents = _get(f"{base}/contents?token={token}")["content"]
        assert "m01-contract.ipynb" in {c["name"] for c in contents}
    finally:
        server.terminate()
        server.wait(10)

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import sys, lib\nprint(sys.executable)\nprint(lib.__version__)")])
    NotebookClient(nb, kernel_name=kernel_name, timeout=120).execute()
    out = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    lines = out.split()
    assert Path(lines[0]).resolve() == Path(sys.executable).resolve()
    assert lines[1] == __import__("lib").__version__
