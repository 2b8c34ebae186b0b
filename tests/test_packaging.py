"""The project's shape: environment.yml vs pyproject, clean notebooks, the TOC."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("m*.ipynb"))


def _split(req: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", req)
    assert m, req
    return m.group(1).lower().replace("_", "-"), m.group(2).replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("gpu", "llm", "book", "dev"):
        wanted += project["optional-dependencies"][extra]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    have = dict(_split(r) for r in pip if not r.startswith("-"))
    for req in wanted:
        name, spec = _split(req)
        assert name in have, f"environment.yml lacks {name}"
        assert have[name] == spec, f"{name}: pyproject {spec!r}, env {have[name]!r}"
    assert "nccl" in conda
    py = next(c for c in conda if c.startswith("python"))
    assert py.replace(" ", "") == "python" + project["requires-python"]


def test_notebooks_are_committed_clean():
    assert NOTEBOOKS
    for nb_path in NOTEBOOKS:
        nb = json.loads(nb_path.read_text())
        for cell in nb["cells"]:
            assert not cell.get("outputs"), f"{nb_path.name} has outputs"
            assert not cell.get("execution_count"), f"{nb_path.name} has counts"
        # nbformat 4.5 gives every cell an id (one without warns at every run)
        ids = [cell.get("id") for cell in nb["cells"]]
        if (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5):
            assert all(ids) and len(set(ids)) == len(ids), \
                f"{nb_path.name}: a cell without an id, or two with one"


def test_every_notebook_has_one_parameters_cell_with_the_four_names():
    for nb_path in NOTEBOOKS:
        nb = json.loads(nb_path.read_text())
        tagged = [c for c in nb["cells"]
                  if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, nb_path.name
        src = "".join(tagged[0]["source"])
        for name in ("machine", "backend", "budget", "seed"):
            assert re.search(rf"^{name} = ", src, re.M), (nb_path.name, name)
        last = "".join(nb["cells"][-1]["source"])
        assert "book.record(" in last, f"{nb_path.name}: the recorder is not last"


def test_toc_lists_every_notebook_and_chapter():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = {toc["root"]}
    for part in toc["parts"]:
        files |= {c["file"] for c in part["chapters"]}
    for nb_path in NOTEBOOKS:
        assert f"notebooks/{nb_path.stem}" in files
    for f in files:
        assert (ROOT / f"{f}.md").exists() or (ROOT / f"{f}.ipynb").exists(), f
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["execute_notebooks"] == "off"


def test_top_level_layout():
    for name in ("book", "lib", "kernels", "notebooks", "figures", "tests",
                 "_config.yml", "_toc.yml", "environment.yml", "README.md",
                 "pyproject.toml", "Makefile", ".ci/run"):
        assert (ROOT / name).exists(), name
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```bash", 1)[1].split("```", 1)[0]
    assert "make book" in first_block and "make test" in first_block
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_contract_imports_nothing_of_the_project():
    src = (ROOT / "lib" / "contract.py").read_text()
    assert not re.search(r"^\s*(from|import)\s+lib\b", src, re.M)
    cli = ROOT / "lib" / "cli"
    for path in (ROOT / "lib").rglob("*.py"):
        # the command line itself and ``python -m lib`` (its entry point)
        if cli not in path.parents and path != ROOT / "lib" / "__main__.py":
            assert not re.search(r"^\s*(from|import)\s+lib\.cli\b", path.read_text(),
                                 re.M), path


def test_the_readme_headline_figure_is_in_the_repository():
    """The repository's own page shows the figure on a fresh clone, and it is
    the one the evaluation chapter draws (m09 writes it, nothing else does)."""
    readme = (ROOT / "README.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme, re.S)
    assert "figures/headline.png" in images
    assert (ROOT / "figures" / "headline.png").stat().st_size > 1000
    tracked = subprocess.run(["git", "ls-files", "figures/headline.png"], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip()
    assert tracked == "figures/headline.png"
    writers = [p.name for p in (ROOT / "notebooks").glob("*.ipynb")
               if "book.save_headline(" in p.read_text()]
    assert writers == ["m09-evaluation.ipynb"]
