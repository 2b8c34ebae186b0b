"""The kernel cache: compiled kernels on disk, every entry sealed by Gate 2b.

An entry is one :class:`~lib.security.SealedEntry` (source, PTX, options,
architecture, compiler) in ``<folder>/<key>.kernel``. The key
(:func:`cache_key`) is the SHA-256 of the config hash, the provider, the model,
the template version, the target architecture, the compile options and the
compiler version, and it is what the seal binds as the entry's config hash, so
an entry cannot be swapped between keys, providers, models, architectures,
options or compilers: a generator set up for ``compute_80`` never asks for the
key of a ``compute_90`` build. For an LLM's kernel the version names where its
spot check ran too (``.spot-emulated``, ``.spot-cuda``): a host with a GPU
never serves a kernel that was only checked in emulation.

A hit is re-verified by :meth:`Seal.load` every time (MAC, key binding,
rollback and placement against the high-water index next to the key, the
folder's permissions) and, when :meth:`KernelCache.get` is told the target,
the sealed entry's architecture, options and compiler must be exactly those
(``seal.target``). An entry that fails is evicted and the event logged on the
``lib.codegen`` logger; the caller regenerates. A refusal that is not the
entry's fault (a loose cache folder, an unreadable index) leaves the file in
place. Writes go through :meth:`Seal.write` (atomic replace under the key's
lock), so processes racing on one key leave one valid entry: the newest.

The cache folder must be owned by this user and writable by nobody else
(:class:`~lib.security.SealError` naming it otherwise); it is created 0700.

Locations: ``$GPUHIVE_HOME/kernels`` (default ``~/.gpuhive/kernels``) and the
key ``$GPUHIVE_HOME/keys/seal.key``. No API key or prompt is ever stored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from lib.security import Seal, SealedEntry, Verdict
from lib.security.seal import check_folder, make_folder, make_target
from lib.storage import gpuhive_home

log = logging.getLogger("lib.codegen")

SUFFIX = ".kernel"


#: Refusals that are not the entry's fault: the file is left in place.
_NOT_THE_ENTRY = frozenset({"seal.folder", "seal.index"})


def cache_key(config_hash: str, provider: str, model: str | None,
              version: str, *, arch: str, options: Sequence[str],
              compiler: str) -> str:
    """64 hex digits naming one cached kernel.

    Args:
        config_hash: the decision's config hash.
        provider, model, version: who wrote the kernel, and the template (and
            prompt) version.
        arch: the target architecture exactly as the entry is sealed with it
            (``"compute_90"``).
        options: the compile options, in order.
        compiler: the compiler and its version (``"nvrtc 12.9"``).

    Raises:
        TypeError: ``arch``, ``options`` or ``compiler`` of the wrong type.
    """
    target = make_target(arch, options, compiler)
    text = json.dumps({"config_hash": config_hash, "provider": provider,
                       "model": model or "", "version": version,
                       "arch": target.arch, "options": list(target.options),
                       "compiler": target.compiler},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class KernelCache:
    """Sealed kernels in a folder.

    Args:
        folder: where entries live; default ``$GPUHIVE_HOME/kernels``
            (created 0700 on the first write).
        key_path: the seal key; default ``$GPUHIVE_HOME/keys/seal.key``
            (created, mode 0600, when missing).

    Raises:
        SealError: the key cannot be trusted, or the key folder or an existing
            cache folder is writable by others or not this user's (one line
            naming the path).
    """

    def __init__(self, folder: Path | str | None = None,
                 key_path: Path | str | None = None) -> None:
        home = gpuhive_home()
        self.folder = Path(folder) if folder else home / "kernels"
        self.seal = Seal(Path(key_path) if key_path else home / "keys" / "seal.key")
        check_folder(self.folder)

    def path(self, key: str) -> Path:
        """The file of entry ``key``."""
        return self.folder / f"{key}{SUFFIX}"

    def get(self, key: str, *, arch: str | None = None,
            options: Sequence[str] | None = None,
            compiler: str | None = None,
            ) -> tuple[SealedEntry | None, Verdict | None]:
        """``(entry, verdict)`` for a verified hit; ``(None, None)`` on a miss;
        ``(None, verdict)`` when the entry failed Gate 2b (and was evicted,
        unless the refusal was the folder's or the index's).

        ``arch``, ``options`` and ``compiler`` (all three or none) are what the
        caller compiles for, as given to :func:`cache_key`; a genuine entry
        that was compiled otherwise is refused (``seal.target``).

        Raises:
            TypeError: some but not all of ``arch``, ``options``, ``compiler``.
        """
        given = [v is not None for v in (arch, options, compiler)]
        if any(given) and not all(given):
            raise TypeError("get: give all of arch, options and compiler, or none")
        target = make_target(arch, options, compiler) if all(given) else None
        path = self.path(key)
        if not os.path.lexists(path):
            return None, None
        if target is None:
            entry, verdict = self.seal.load(path, key)
        else:
            entry, verdict = self.seal.load(path, key, target)
        if entry is None:
            if set(verdict.checks) & _NOT_THE_ENTRY:
                log.warning("cache entry %s failed Gate 2b: %s; left in place",
                            path.name, verdict.summary())
                return None, verdict
            log.warning("cache entry %s failed Gate 2b: %s; evicted, "
                        "regenerating", path.name, verdict.summary())
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                log.warning("cache entry %s is a folder; left in place", path)
        return entry, verdict

    def put(self, key: str, source: str, ptx: str, options: tuple[str, ...],
            arch: str, compiler: str) -> SealedEntry:
        """Seal and write one kernel; returns the entry that was sealed.

        When another process wrote a newer entry for the same key first, that
        one is kept (both are genuine and equivalent).
        """
        entry = self.seal.seal(source, ptx.encode(), key, options, arch, compiler)
        make_folder(self.folder)
        if not self.seal.write(entry, self.path(key)):
            log.info("cache entry %s: a newer one was written concurrently; "
                     "kept it", key[:16])
        return entry

    def entries(self) -> list[Path]:
        """Every entry file in the folder."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob(f"*{SUFFIX}"))
