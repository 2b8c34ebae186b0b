"""The build: papermill executes every notebook into a staging copy, Jupyter
Book builds the HTML from it, and no page may show what a reader should not
see (:func:`page_problems`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

from lib.book.pages import KERNEL_NAME, book_root
from lib.budgets import check_budget
from lib.platform.machines import PROFILES_ENV, load_machine
from lib.storage import machine_file


class BookError(RuntimeError):
    """A notebook failed or the HTML build reported warnings."""


def notebooks(root: Path) -> list[Path]:
    """The milestone notebooks, in order."""
    return sorted((root / "notebooks").glob("m*.ipynb"))


def _kernel_manager_class() -> type | None:
    """The kernel manager the book's kernels start under: jupyter_client's
    own, with its CurveZMQ transport encryption on where the kernelspec
    declares it (ipykernel 7 does) and pyzmq has Curve; then ipykernel no
    longer warns, once per notebook, that the kernel talks over TCP in
    plain text. None (nbclient's default) where either lacks it."""
    import zmq
    from jupyter_client import AsyncKernelManager
    from traitlets import default

    if not (zmq.has("curve") and AsyncKernelManager.class_traits().get(
            "transport_encryption") is not None):
        return None

    class EncryptedKernelManager(AsyncKernelManager):
        @default("transport_encryption")
        def _auto(self) -> str:
            return "auto"   # encrypt where the kernel says it can
    return EncryptedKernelManager


def execute_notebook(source: Path, output: Path, *, machine: str, backend: str,
                     budget: str, seed: int, cwd: Path,
                     timeout: int = 1800) -> float:
    """Run one notebook with papermill; return the seconds it took."""
    import papermill

    output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(source), str(output),
            parameters={"machine": machine, "backend": backend, "budget": budget,
                        "seed": seed},
            cwd=str(cwd), kernel_name=KERNEL_NAME, progress_bar=False,
            execution_timeout=timeout,
            **({"kernel_manager_class": km} if (km := _kernel_manager_class())
               else {}),
        )
    except papermill.PapermillExecutionError as exc:
        raise BookError(f"notebook {source.name} failed in cell "
                        f"{exc.exec_count}: {exc.ename}: {exc.evalue}") from None
    _show_parameters_once(output)
    return time.perf_counter() - start


def _show_parameters_once(path: Path) -> None:
    """Drop the notebook's own ``parameters`` cell from an executed copy when
    papermill injected the values it ran with right after it: a reader sees
    the values once, the ones that built the page."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    tags = [set(c.get("metadata", {}).get("tags", [])) for c in nb.cells]
    if any("injected-parameters" in t for t in tags):
        nb.cells = [c for c, t in zip(nb.cells, tags, strict=True)
                    if "parameters" not in t or "injected-parameters" in t]
        nbformat.write(nb, path)


def build_book(machine: str = "hetero-4", backend: str = "model",
               budget: str = "quick", seed: int = 0, html: bool = True,
               root: Path | None = None) -> Path:
    """Execute every notebook and build the HTML; return ``_build/html``."""
    check_budget(budget)
    found = load_machine(machine)  # an unknown machine fails here, in one line
    if found.name != machine and Path(machine).expanduser().is_file():
        # a profile given by its path: the notebooks find it by its name, so
        # the pages name the machine rather than a file on this computer
        own = os.environ.get(PROFILES_ENV)
        os.environ[PROFILES_ENV] = os.pathsep.join(
            [str(Path(machine).expanduser().resolve()), *([own] if own else [])])
        machine = found.name
    root = root or book_root()
    if not (root / "_config.yml").is_file() or not (root / "notebooks").is_dir():
        raise BookError(f"no book here: {root} has no _config.yml and notebooks/; "
                        "run gpuhive book (or make book) in the project's folder")
    stage = root / "_build" / "book-src"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(root / name, stage / name)
    shutil.copytree(root / "book", stage / "book")
    # chapters show real code with literalinclude ../lib/...
    shutil.copytree(root / "lib", stage / "lib",
                    ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    os.environ.setdefault("GPUHIVE_RECORD_DIR",
                          str(root / "_build" / "records" / machine_file(machine)))
    # the build keeps what it measures and seals in a home of its own, so it
    # never touches the user's ~/.gpuhive (set GPUHIVE_HOME to share one)
    os.environ.setdefault("GPUHIVE_HOME", str(root / "_build" / "home"))
    found = notebooks(root)
    for i, nb in enumerate(found, 1):
        print(f"[{i}/{len(found)}] executing {nb.name} (machine={machine}, "
              f"backend={backend}, budget={budget}) ...", flush=True)
        secs = execute_notebook(nb, stage / "notebooks" / nb.name, machine=machine,
                                backend=backend, budget=budget, seed=seed, cwd=root)
        print(f"      done in {secs:.1f} s", flush=True)
    if not html:
        return stage
    print("building HTML with Jupyter Book ...", flush=True)
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(stage),
           "--path-output", str(root), "-W", "-n", "--keep-going"]
    # the findings chapter reads this machine's evaluation record
    env = {**os.environ, "GPUHIVE_BOOK_MACHINE": machine}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise BookError(f"jupyter-book build failed:\n{tail}")
    out = root / "_build" / "html"
    problems = page_problems(out, root)
    if problems:
        raise BookError(f"{len(problems)} page output(s) a reader should not see "
                        "(the first ones):\n" + "\n".join(problems[:20]))
    print(f"book: {out / 'index.html'}")
    return out


#: What no cell output on a page may show: an absolute path of this computer,
#: a Python object's repr of a path, or a warning (a reader cannot act on it).
OUTPUT_PROBLEMS = (
    (re.compile(r"(?<![\w.])/(?:tmp|root|home|work|var|Users)/[\w.-]"),
     "an absolute path"),
    (re.compile(r"PosixPath\(|WindowsPath\("), "a path object's repr"),
    (re.compile(r"\b\w*Warning\b[:(]|\bWARNING\b"), "a warning"),
)
#: Output lines longer than this run off the content column (plain-text
#: outputs; tables are HTML and scroll inside their box).
MAX_OUTPUT_CHARS = 100


class _Outputs(HTMLParser):
    """The text of every cell output (``div.cell_output``) of a page, and
    apart from it the text of its ``pre`` blocks (plain-text outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0          # div nesting inside the current cell output
        self.pre = 0            # pre nesting inside it
        self.texts: list[str] = []
        self.plain: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if self.depth:
            self.depth += tag == "div"
            if tag == "pre":
                self.pre += 1
                self.plain.append("")
        elif tag == "div" and "cell_output" in classes:
            self.depth, self.pre = 1, 0
            self.texts.append("")

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag == "div":
            self.depth -= 1
        elif self.pre and tag == "pre":
            self.pre -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.texts[-1] += data
            if self.pre:
                self.plain[-1] += data


def page_problems(html_dir: Path, root: Path | None = None) -> list[str]:
    """``page: what`` for every cell output of the built book that shows an
    absolute path, a path object, a warning (:data:`OUTPUT_PROBLEMS`), or a
    text line wider than :data:`MAX_OUTPUT_CHARS`; empty when the pages are
    clean. ``root``: the project folder, whose own path counts too."""
    found = []
    for page in sorted(Path(html_dir).rglob("*.html")):
        if "_static" in page.parts or "_sources" in page.parts:
            continue
        parser = _Outputs()
        parser.feed(page.read_text(errors="replace"))
        name = page.relative_to(html_dir).as_posix()
        for text in parser.texts:
            for pattern, what in OUTPUT_PROBLEMS:
                hit = pattern.search(text)
                if hit:
                    near = text[max(0, hit.start() - 30):hit.end() + 40]
                    found.append(f"{name}: {what}: {near!r}")
            if root is not None and str(root) in text:
                found.append(f"{name}: the project's own path in an output")
        for text in parser.plain:
            wide = [line for line in text.splitlines() if len(line) > MAX_OUTPUT_CHARS]
            if wide:
                found.append(f"{name}: an output line of {len(wide[0])} characters: "
                             f"{wide[0][:60]!r}...")
    return found


