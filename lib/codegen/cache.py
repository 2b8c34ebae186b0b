"""The kernel cache: compiled kernels on disk, every entry sealed by Gate 2b.

An entry is one :class:`~lib.security.SealedEntry` (source, PTX, options,
architecture, compiler) in ``<folder>/<key>.kernel``. The key
(:func:`cache_key`) is the SHA-256 of the config hash, the provider, the model
and the template version, and it is what the seal binds as the entry's config
hash, so an entry cannot be swapped between keys, providers or models.

A hit is re-verified by :meth:`Seal.load` every time (MAC, key binding,
rollback against the high-water index next to the key). An entry that fails
is evicted and the event logged on the ``lib.codegen`` logger; the caller
regenerates. Writes go through :meth:`Seal.write` (atomic replace under the
key's lock), so processes racing on one key leave one valid entry: the newest.

Locations: ``$GPUHIVE_HOME/kernels`` (default ``~/.gpuhive/kernels``) and the
key ``$GPUHIVE_HOME/keys/seal.key``. No API key or prompt is ever stored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from lib.security import Seal, SealedEntry, Verdict
from lib.storage import gpuhive_home

log = logging.getLogger("lib.codegen")

SUFFIX = ".kernel"


def cache_key(config_hash: str, provider: str, model: str | None,
              version: str) -> str:
    """64 hex digits naming one cached kernel."""
    text = json.dumps({"config_hash": config_hash, "provider": provider,
                       "model": model or "", "version": version},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class KernelCache:
    """Sealed kernels in a folder.

    Args:
        folder: where entries live; default ``$GPUHIVE_HOME/kernels``.
        key_path: the seal key; default ``$GPUHIVE_HOME/keys/seal.key``
            (created, mode 0600, when missing).
    """

    def __init__(self, folder: Path | str | None = None,
                 key_path: Path | str | None = None) -> None:
        home = gpuhive_home()
        self.folder = Path(folder) if folder else home / "kernels"
        self.seal = Seal(Path(key_path) if key_path else home / "keys" / "seal.key")

    def path(self, key: str) -> Path:
        """The file of entry ``key``."""
        return self.folder / f"{key}{SUFFIX}"

    def get(self, key: str) -> tuple[SealedEntry | None, Verdict | None]:
        """``(entry, verdict)`` for a verified hit; ``(None, None)`` on a miss;
        ``(None, verdict)`` when the entry failed Gate 2b and was evicted."""
        path = self.path(key)
        if not os.path.lexists(path):
            return None, None
        entry, verdict = self.seal.load(path, key)
        if entry is None:
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
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.seal.write(entry, self.path(key)):
            log.info("cache entry %s: a newer one was written concurrently; "
                     "kept it", key[:16])
        return entry

    def entries(self) -> list[Path]:
        """Every entry file in the folder."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob(f"*{SUFFIX}"))
