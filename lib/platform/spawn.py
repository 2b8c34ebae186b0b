"""Worker processes that do not run the caller's script: :func:`bare_main`.

The cpu backend's workers and a ``dask-local`` cluster's are spawned: each
is a fresh interpreter, and Python's spawn imports the parent's main module
in it (as ``__mp_main__``) before it runs the worker. A script that used
either without an ``if __name__ == "__main__":`` guard therefore ran its own
top level again in every worker, whose attempt to start workers of its own
stopped it; and a script read from standard input (``python - < mine.py``)
could not be found by its workers at all. A worker needs nothing from the
script: its code lives in this package, and a function of the user's (a
registered kind's) travels with the job, pickled by value.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Iterator

_LOCK = threading.RLock()


@contextlib.contextmanager
def bare_main() -> Iterator[None]:
    """While it is open, ``sys.modules["__main__"]`` is an empty module, so a
    process spawned meanwhile is not told to import the caller's script.

    One thread at a time (a lock; the same thread may nest it): the caller's
    main module is put back when the outermost one closes, whatever happened
    inside.
    """
    with _LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is None:
                sys.modules.pop("__main__", None)
            else:
                sys.modules["__main__"] = main
