"""One BLAS thread while training: the nets' matrices are small.

NumPy's BLAS (OpenBLAS) splits a product over every core it sees. For the set
network's products (thousands of rows by 64 columns) that gains little on an
idle machine and loses badly on a busy one: with other processes on the two
cores of the reference machine, ``x.T @ dout`` on 8192 x 64 rows takes 25 ms
with two threads and 1.3 ms with one (MEASURED there). :func:`single_blas_thread`
sets the OpenBLAS thread count to one for a block and restores it after; where
no OpenBLAS is loaded (another BLAS, a platform without ``/proc``) it does
nothing.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: (set, get) symbol pairs OpenBLAS builds export, the plain one first.
_SYMBOLS = (("openblas_set_num_threads", "openblas_get_num_threads"),
            ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
            ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"))


def _openblas() -> list[tuple[object, object]]:
    """(set, get) functions of every OpenBLAS this process has loaded."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    found = []
    for path in sorted(set(re.findall(r"(/\S*openblas\S*\.so[\w.]*)", maps))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _SYMBOLS:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                found.append((getattr(lib, set_name), getattr(lib, get_name)))
                break
    return found


@contextmanager
def single_blas_thread() -> Iterator[None]:
    """Run the block with one OpenBLAS thread, then restore the count."""
    libs = _openblas()
    before = []
    for set_fn, get_fn in libs:
        before.append(int(get_fn()))
        set_fn(1)
    try:
        yield
    finally:
        for (set_fn, _), n in zip(libs, before, strict=True):
            set_fn(n)
