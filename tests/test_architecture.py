"""The structure of lib/: layers, no cycles, imports at the top, modules that
can be read in one sitting. The layers are written down once, in pyproject's
``[tool.importlinter]``; the architecture chapter describes the same."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib"
#: Where the project may be imported inside functions (or by
#: ``importlib.import_module``), and why: each to start fast, each written down
#: in the architecture chapter.
LAZY_OK = {
    # each command's plane on demand, so ``gpuhive --help`` is fast
    LIB / "cli",
    # every policy's name without importing Numba for the learned policy or the
    # optimum's search, which the command line's parser lists
    LIB / "policies" / "registry.py",
    # the backend classes on first use (PEP 562), so a spawned cpu worker
    # imports neither the CUDA nor the Dask backend
    LIB / "execution" / "__init__.py",
}
#: Lines above which a module's docstring must say why it is one module.
LONG_MODULE = 500


def _modules() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


def test_import_contracts_hold():
    exe = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_project_imports_sit_at_module_top_except_where_written_down():
    late = []
    for path in _modules():
        if path in LAZY_OK or LAZY_OK & set(path.parents):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                names = []
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif (isinstance(node, ast.Call)
                      and isinstance(node.func, ast.Attribute)
                      and node.func.attr == "import_module"):
                    arg = node.args[0] if node.args else None
                    names = [arg.value if isinstance(arg, ast.Constant)
                             and isinstance(arg.value, str)
                             else "lib.? (a module named at run time)"]
                late += [f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                         for n in names if n == "lib" or n.startswith("lib.")]
    assert not late, "project imports inside functions:\n" + "\n".join(late)


def test_long_modules_say_why():
    unexplained = []
    for path in _modules():
        text = path.read_text()
        if text.count("\n") <= LONG_MODULE:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if "Why one module" not in doc:
            unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} "
                               "lines)")
    assert not unexplained, (f"modules over {LONG_MODULE} lines whose docstring "
                             "has no 'Why one module' paragraph: "
                             + ", ".join(unexplained))


def _contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layered = next(c for c in contracts if c["type"] == "layers")
    return [" · ".join(part.strip() for part in layer.split("|"))
            for layer in layered["layers"]]


def test_the_architecture_chapter_lists_the_contract_layers():
    text = (ROOT / "book" / "architecture.md").read_text()
    table = text.split("<!-- layers:", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1].strip().replace("`", "")
            for line in table.splitlines()[2:] if line.startswith("|")]
    assert rows == _contract_layers()
