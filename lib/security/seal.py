"""Gate 2b: an integrity seal on every compiled kernel kept in the cache.

A :class:`Seal` holds a 32-byte secret key (``secrets.token_bytes``) in a key
file of mode 0600 and computes an HMAC-SHA256 over the whole tuple that makes
a cache entry: source, compiled bytes, config hash, compile options, target
architecture, compiler version, format version and a monotonic counter. The
fields are length-prefixed before hashing, so no two tuples share a message.

Threat model: the cache folder is writable by an attacker, who may delete,
replace, copy or restore any file in it. The key folder is trusted: the key
lives there (mode 0600, folder 0700), and whoever can write there holds the
key anyway. So everything that vouches for freshness lives next to the key,
never in the cache folder.

The counter is persisted next to the key (``<key>.counter``, itself MACed) and
incremented under a file lock, so it is unique across processes. The
high-water index is kept next to the key as well (``<key>.index``, mode 0600,
MACed, replaced atomically under the key's lock): for each cache folder (its
absolute path as written, symlinks not resolved, so a subfolder swapped for a
link elsewhere keeps its marks) and each config hash, the counter of the entry
:meth:`Seal.write` last wrote there (the newest: an older one is never written
over a newer one).

An entry is bound to the folder it was written to: the index (MACed under the
key) binds folder, config hash and counter, the entry's MAC binds config hash,
counter and content, and a counter is never issued twice. So
:meth:`Seal.load` accepts a genuine entry only when its counter *equals* its
folder's mark for its config hash: below the mark it is a rollback, with no
mark it was never written to that folder, above the mark it was written to
another cache folder under the same key and copied in (``seal.placement``).
Deleting or restoring files in the cache folder changes none of this.
:meth:`Seal.write` raises the mark before it replaces the file, so a crash
between the two leaves an entry that is refused and regenerated, never a
counter in a cache folder above every mark.

A counter is never issued twice, even when the counter file is deleted or an
old copy of it is put back: the next counter is one past both the counter
file and the highest mark in the index, and a counter file that is missing
while the index holds marks, or that is behind them, is repaired with a
warning on the ``lib.security`` logger (it never makes later writes vanish
as "older" than what is already there).

Folders: the key folder (checked when a :class:`Seal` is made) and every cache
folder (checked on each :meth:`Seal.write` and :meth:`Seal.load`) must be owned
by this user and writable by nobody else (no group or other write bit);
otherwise anyone could swap files in them. Folders the seal creates get mode
0700.

Entry files are opened without following a final symlink and without
blocking (a FIFO is refused, never waited on); anything but a regular file is
refused, and so is a file whose size (``st_size``, the apparent size, so a
sparse file counts in full) exceeds :data:`MAX_ENTRY_BYTES`, before a byte of
it is read.

:meth:`Seal.verify` and :meth:`Seal.load` never raise on bad input; they
return a :class:`~lib.security.verdict.Verdict` (gate ``"gate2b"``):

==================  ===========================================================
check id            what it refuses
==================  ===========================================================
seal.io             a file that cannot be read (missing, a folder, a symlink,
                    a FIFO, socket or device) or is larger than
                    MAX_ENTRY_BYTES (sparse or not), refused unread
seal.folder         a cache folder that is group- or other-writable or not
                    owned by this user (its files cannot be trusted)
seal.format         not a sealed entry: bad header, JSON or field types, an
                    unknown format version, a non-canonical encoding
seal.truncated      a file shorter than its header declares (or empty)
seal.missing_mac    an entry without a MAC
seal.mac            a MAC that does not match: a changed byte anywhere, or an
                    entry sealed under another key
seal.key_mismatch   a genuine entry for another config hash than the one asked
                    for (an entry swapped between cache keys)
seal.rollback       a counter below the high-water mark for that config hash
                    in that folder, or an entry never written to that folder
seal.placement      a genuine entry newer than the one last written to that
                    folder for its config hash: written to another cache
                    folder under the same key and copied in
seal.target         a genuine entry compiled for another architecture, with
                    other options or by another compiler than the caller asked
                    for (the ``target`` of :meth:`Seal.load`)
seal.index          a high-water index (next to the key) that is unreadable or
                    wrongly MACed
==================  ===========================================================

Key-file problems (wrong mode, owner, size, a symlink, a loose key folder)
raise :class:`SealError` naming the path: without a trustworthy key nothing can
be verified.

File layout: one ASCII header line ``GPUHIVE-SEAL <format> <body bytes>``,
then the body, canonical JSON (sorted keys, no blanks, ASCII) with the binary
in base64.

Why one module: the seal is a trust boundary. The key's handling, the entry's
format, the MAC, the per-folder counter and its high-water index, and the lock
that orders writers hold one set of invariants between them (an entry is
accepted only if every one holds); split across files, a reviewer could check
each part and miss how they fail together.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from lib.security.verdict import Verdict, Violation
from lib.storage import fsync_dir, write_atomic

log = logging.getLogger("lib.security")

GATE = "gate2b"
FORMAT_VERSION = 1
KEY_BYTES = 32
MAGIC = b"GPUHIVE-SEAL"
#: Suffix of the high-water index next to the key: ``<key>.index``.
INDEX_SUFFIX = ".index"
#: Entry files larger than this (bytes, apparent size) are refused unread. A
#: kernel's PTX is kilobytes to a few megabytes; base64 adds a third.
MAX_ENTRY_BYTES = 64 << 20
#: Permission bits a trusted folder may not have.
LOOSE_BITS = stat.S_IWGRP | stat.S_IWOTH

_HEADER_RE = re.compile(rb"GPUHIVE-SEAL ([0-9]{1,3}) ([0-9]{1,12})")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")
_FIELDS = ("arch", "binary", "compiler", "config_hash", "counter",
           "format_version", "mac", "options", "source")


class SealError(Exception):
    """The key file (or the counter or index next to it, or a folder) cannot be
    trusted."""


class Target(NamedTuple):
    """What a caller asks a cached kernel to have been compiled for.

    Attributes:
        arch: the target architecture, as sealed (e.g. ``"compute_90"``).
        options: the compile options, in order.
        compiler: the compiler and its version (e.g. ``"nvrtc 12.4"``).
    """

    arch: str
    options: tuple[str, ...]
    compiler: str


def make_target(arch: str, options: Sequence[str], compiler: str) -> Target:
    """A :class:`Target`, its fields checked.

    Raises:
        TypeError: a field of the wrong type, named.
    """
    for name, value in (("arch", arch), ("compiler", compiler)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be str, got {type(value).__name__}")
    if isinstance(options, (str, bytes)) or not all(
            isinstance(o, str) for o in options):
        raise TypeError("options must be a sequence of str")
    return Target(arch, tuple(options), compiler)


def folder_problem(folder: Path | str, what: str = "cache folder") -> str | None:
    """Why ``folder`` cannot be trusted (one line naming ``what`` and its
    path), or ``None``.

    Trusted: owned by this user, no group or other write bit. A folder that
    does not exist is no problem here (whoever creates it makes it 0700).
    """
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{what} {folder} cannot be examined: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return None  # reading it as a folder fails and says so
    if st.st_uid != os.getuid():
        return (f"{what} {folder} is owned by uid {st.st_uid}, not by this user "
                f"(uid {os.getuid()}); refusing it")
    mode = stat.S_IMODE(st.st_mode)
    if mode & LOOSE_BITS:
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP),
                                            ("others", stat.S_IWOTH)) if mode & bit)
        return (f"{what} {folder} is writable by {who} (mode {mode:04o}); "
                "refusing it (chmod go-w)")
    return None


def check_folder(folder: Path | str, what: str = "cache folder") -> None:
    """Raise :class:`SealError` if :func:`folder_problem` finds one."""
    problem = folder_problem(folder, what)
    if problem:
        raise SealError(problem)


def make_folder(folder: Path, what: str = "cache folder") -> None:
    """Create ``folder`` (mode 0700, whatever the umask) if missing, then
    check it (:func:`check_folder`)."""
    if not os.path.isdir(folder):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.chmod(folder, 0o700)  # umask may have taken bits; never adds any
        except OSError:
            pass
    check_folder(folder, what)


@dataclass(frozen=True)
class SealedEntry:
    """One compiled kernel and everything it was compiled from, sealed.

    Attributes:
        source: the CUDA source that passed Gate 2a.
        binary: the compiled bytes (PTX or cubin).
        config_hash: the cache key, the hash of the decision and task.
        options: the compile options, in order.
        arch: the target architecture, e.g. ``"sm_90"``.
        compiler: the compiler and its version, e.g. ``"nvrtc 12.4"``.
        format_version: the entry format, :data:`FORMAT_VERSION`.
        counter: the monotonic seal counter (1, 2, ...) of the key.
        mac: HMAC-SHA256 of all the above, 64 lowercase hex digits; ``""``
            when missing.
    """

    source: str
    binary: bytes
    config_hash: str
    options: tuple[str, ...]
    arch: str
    compiler: str
    format_version: int
    counter: int
    mac: str


def _frame(fields: Sequence[bytes]) -> bytes:
    """Length-prefix each field (8 bytes, big-endian) and join."""
    return b"".join(len(f).to_bytes(8, "big") + f for f in fields)


def _mac_message(e: SealedEntry) -> bytes:
    return _frame([
        b"gpuhive.seal.entry",
        e.source.encode("utf-8"),
        bytes(e.binary),
        e.config_hash.encode("utf-8"),
        str(len(e.options)).encode(),
        *(o.encode("utf-8") for o in e.options),
        e.arch.encode("utf-8"),
        e.compiler.encode("utf-8"),
        str(e.format_version).encode(),
        str(e.counter).encode(),
    ])


def _target_problems(e: SealedEntry, target: Target) -> list[Violation]:
    """How a genuine entry differs from what was asked for, one violation."""
    asked = make_target(*target)
    diffs = [f"{name} {have!r:.80}, asked {want!r:.80}"
             for name, have, want in (("arch", e.arch, asked.arch),
                                      ("options", e.options, asked.options),
                                      ("compiler", e.compiler, asked.compiler))
             if have != want]
    if not diffs:
        return []
    return [Violation("seal.target", "entry for config hash "
                      f"{e.config_hash[:64]!r} was compiled with "
                      + "; ".join(diffs))]


def _canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, allow_nan=False).encode("ascii")


def _encode(e: SealedEntry) -> bytes:
    """The file bytes of an entry: header line, then canonical JSON."""
    body_obj = {
        "arch": e.arch,
        "binary": base64.b64encode(e.binary).decode("ascii"),
        "compiler": e.compiler,
        "config_hash": e.config_hash,
        "counter": e.counter,
        "format_version": e.format_version,
        "options": list(e.options),
        "source": e.source,
    }
    if e.mac:
        body_obj["mac"] = e.mac
    body = _canonical_json(body_obj)
    return MAGIC + f" {e.format_version} {len(body)}\n".encode() + body


def _is_header_prefix(data: bytes) -> bool:
    head = MAGIC + b" "
    if len(data) <= len(head):
        return head.startswith(data)
    rest = data[len(head):]
    return data.startswith(head) and re.fullmatch(rb"[0-9]{0,3}( [0-9]{0,12})?",
                                                  rest) is not None


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key in sealed entry")
    return dict(pairs)


def _bad_float(text: str) -> float:
    raise ValueError(f"non-finite number {text} in sealed entry")


def _field_problems(e: SealedEntry) -> list[str]:
    """Type problems of an entry's fields, one message each."""
    problems = []
    for name in ("source", "config_hash", "arch", "compiler", "mac"):
        if not isinstance(getattr(e, name), str):
            problems.append(f"field {name} is {type(getattr(e, name)).__name__}, "
                            "not str")
    if not isinstance(e.binary, bytes):
        problems.append(f"field binary is {type(e.binary).__name__}, not bytes")
    if not isinstance(e.options, tuple) or not all(
            isinstance(o, str) for o in e.options):
        problems.append("field options is not a tuple of str")
    for name in ("format_version", "counter"):
        v = getattr(e, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            problems.append(f"field {name} is {v!r:.40}, not a non-negative int")
    return problems


def _parse(data: bytes) -> tuple[SealedEntry | None, list[Violation]]:
    """Decode entry-file bytes; never raises."""
    fmt = "seal.format"
    nl = data.find(b"\n", 0, 64)
    if nl < 0:
        if _is_header_prefix(data[:64]):
            return None, [Violation("seal.truncated", f"file ends inside the "
                                    f"header after {len(data)} bytes")]
        return None, [Violation(fmt, "file does not start with a "
                                "'GPUHIVE-SEAL <format> <length>' header")]
    m = _HEADER_RE.fullmatch(data[:nl])
    if m is None:
        return None, [Violation(fmt, f"bad header {data[:nl][:60]!r}")]
    version, length = int(m.group(1)), int(m.group(2))
    if version != FORMAT_VERSION:
        return None, [Violation(fmt, f"format version {version}, expected "
                                f"{FORMAT_VERSION}")]
    body = data[nl + 1:]
    if len(body) < length:
        return None, [Violation("seal.truncated", f"body has {len(body)} of the "
                                f"{length} bytes its header declares")]
    if len(body) > length:
        return None, [Violation(fmt, f"{len(body) - length} bytes after the "
                                "declared end of the body")]
    try:
        obj = json.loads(body.decode("ascii"), object_pairs_hook=_reject_duplicates,
                         parse_constant=_bad_float)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return None, [Violation(fmt, f"body is not strict ASCII JSON: "
                                f"{str(exc)[:80]}")]
    if not isinstance(obj, dict):
        return None, [Violation(fmt, f"body is a JSON {type(obj).__name__}, not "
                                "an object")]
    found: list[Violation] = []
    missing = [f for f in _FIELDS if f != "mac" and f not in obj]
    unknown = sorted(set(obj) - set(_FIELDS))
    if missing or unknown:
        return None, [Violation(fmt, f"fields missing {missing} or unknown "
                                f"{unknown[:5]}")]
    mac = obj.get("mac", "")
    if mac == "" or mac is None:
        found.append(Violation("seal.missing_mac", "entry carries no MAC"))
        mac = ""
    binary = obj["binary"]
    try:
        raw = base64.b64decode(binary, validate=True) if isinstance(binary, str) \
            else None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or base64.b64encode(raw).decode("ascii") != binary:
        return None, found + [Violation(fmt, "field binary is not canonical "
                                        "base64")]
    options = obj["options"]
    entry = SealedEntry(
        source=obj["source"], binary=raw, config_hash=obj["config_hash"],
        options=tuple(options) if isinstance(options, list) else options,
        arch=obj["arch"], compiler=obj["compiler"],
        format_version=obj["format_version"], counter=obj["counter"], mac=mac,
    )
    problems = _field_problems(entry)
    if problems:
        return None, found + [Violation(fmt, p) for p in problems]
    if entry.format_version != version:
        return None, found + [Violation(fmt, f"body format {entry.format_version}"
                                        f" differs from header {version}")]
    try:
        canonical = _encode(entry) == data
    except (UnicodeError, ValueError):
        canonical = False
    if not canonical:
        return None, found + [Violation(fmt, "entry is not in canonical form")]
    return entry, found


_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@contextmanager
def _locked(path: Path, shared: bool = False) -> Iterator[None]:
    """Hold a ``flock`` on ``path`` (created if missing): exclusive for a
    writer, shared for a reader. A reader that cannot open the lock file (a
    read-only key folder) goes on unlocked: no writer can hold it either."""
    flags = (os.O_RDONLY if shared else os.O_RDWR) | os.O_CREAT | os.O_NOFOLLOW \
        | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        if not shared:
            raise
        fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


class NotRegularError(OSError):
    """A path that is not a regular file, or one too large to read."""


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _read_small(path: Path, limit: int) -> bytes:
    """Read a regular file of at most ``limit`` bytes.

    Opened without following a final symlink and without blocking (a FIFO
    opens at once and is refused); the kind and the size are read from the
    open descriptor, so what is checked is what is read, and nothing is read
    from a file that is not regular or whose apparent size is over ``limit``.
    A file that grows while it is read is refused too.
    """
    fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)),
                        "not a regular file")
            raise NotRegularError(f"{kind}, not a regular file")
        if st.st_size > limit:
            raise NotRegularError(f"holds {st.st_size} bytes, over the limit of "
                                  f"{limit}; refused unread")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(1 << 20, left))):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise NotRegularError(f"grew past the limit of {limit} bytes while "
                                  "being read")
        return b"".join(chunks)
    finally:
        os.close(fd)


class Seal:
    """Seals, writes, loads and verifies cache entries under one secret key.

    Args:
        key_path: the key file. Created with mode 0600 (and its folder with
            0700) when missing; an existing key file must be a regular file of
            mode 0600, owned by this user, holding exactly 32 bytes, or
            :class:`SealError` is raised naming the path.
    """

    def __init__(self, key_path: Path | str) -> None:
        self.key_path = Path(key_path)
        self._counter_path = self.key_path.with_name(self.key_path.name + ".counter")
        self._lock_path = self.key_path.with_name(self.key_path.name + ".lock")
        #: The high-water index, next to the key (never in a cache folder).
        self.index_path = self.key_path.with_name(self.key_path.name + INDEX_SUFFIX)
        self._key = self._load_or_create_key()

    # ---- the key -----------------------------------------------------------
    def _load_or_create_key(self) -> bytes:
        path = self.key_path
        try:
            make_folder(path.parent, "key folder")
        except OSError as exc:
            raise SealError(f"cannot create key folder {path.parent}: {exc}") from exc
        try:
            return self._read_key()
        except FileNotFoundError:
            pass
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600)
            try:
                os.fchmod(fd, 0o600)  # whatever the umask
                os.write(fd, secrets.token_bytes(KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # publish atomically; the first process wins
            except FileExistsError:
                pass
            fsync_dir(path.parent)
        except OSError as exc:
            raise SealError(f"cannot create key file {path}: {exc}") from exc
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return self._read_key()

    def _read_key(self) -> bytes:
        path = self.key_path
        try:
            fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise SealError(f"cannot open key file {path} (a symlink?): {exc}"
                            ) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SealError(f"key file {path} is not a regular file")
            mode = stat.S_IMODE(st.st_mode)
            if mode != 0o600:
                raise SealError(f"key file {path} has mode {mode:04o}; refusing it, "
                                "the mode must be 0600")
            if st.st_uid != os.getuid():
                raise SealError(f"key file {path} is owned by uid {st.st_uid}, not "
                                f"by this user (uid {os.getuid()})")
            key = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(key) != KEY_BYTES:
            raise SealError(f"key file {path} holds {len(key)} bytes or more, "
                            f"expected {KEY_BYTES}")
        return key

    def _hmac(self, tag: bytes, message: bytes) -> str:
        return hmac.new(self._key, _frame([tag, message]), hashlib.sha256).hexdigest()

    @property
    def key_id(self) -> str:
        """A short public fingerprint of the key (16 hex digits), for logs."""
        return self._hmac(b"gpuhive.seal.key-id", b"")[:16]

    # ---- the counter ---------------------------------------------------------
    def _read_counter(self) -> int | None:
        """The counter file's value; ``None`` when there is no counter file."""
        path = self._counter_path
        try:
            data = _read_small(path, 4096)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SealError(f"cannot read counter file {path}: {exc}") from exc
        try:
            obj = json.loads(data.decode("ascii"))
            n = obj["counter"]
            ok = isinstance(n, int) and not isinstance(n, bool) and n >= 0 \
                and hmac.compare_digest(str(obj["mac"]),
                                        self._hmac(b"gpuhive.seal.counter",
                                                   str(n).encode()))
        except (ValueError, UnicodeDecodeError, KeyError, TypeError):
            ok = False
        if not ok:
            raise SealError(f"counter file {path} is malformed or its MAC is wrong")
        return n

    def _next_counter(self) -> int:
        """One past both the counter file and every mark in the index.

        A counter file that is missing while the index holds marks, or that is
        behind them (an old copy put back), would reissue counters already
        written: later writes would then be refused as older than what is
        there, silently. It is repaired, with a warning.
        """
        with _locked(self._lock_path):
            stored = self._read_counter()
            marks = self._read_index()
            top = max((v for row in marks.values() for v in row.values()),
                      default=0)
            if top > (stored or 0):
                what = "is missing" if stored is None else f"holds {stored}"
                log.warning("counter file %s %s but the high-water index %s "
                            "records counter %d; continuing from %d",
                            self._counter_path, what, self.index_path, top, top + 1)
            n = max(stored or 0, top) + 1
            mac = self._hmac(b"gpuhive.seal.counter", str(n).encode())
            write_atomic(self._counter_path,
                          _canonical_json({"counter": n, "mac": mac}))
        return n

    # ---- the high-water index ---------------------------------------------------
    def _index_mac(self, marks: dict) -> str:
        return self._hmac(b"gpuhive.seal.index", _canonical_json(marks))

    def _read_index(self) -> dict[str, dict[str, int]]:
        """Cache folder -> config hash -> newest counter written there.

        Raises:
            SealError: the index next to the key is unreadable or tampered.
        """
        path = self.index_path
        try:
            data = _read_small(path, 64 << 20)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise SealError(f"cannot read high-water index {path}: {exc}") from exc
        try:
            obj = json.loads(data.decode("ascii"))
            marks = obj["high_water"]
            ok = isinstance(marks, dict) and all(
                isinstance(folder, str) and isinstance(row, dict) and all(
                    isinstance(k, str) and isinstance(v, int)
                    and not isinstance(v, bool) for k, v in row.items())
                for folder, row in marks.items()
            ) and hmac.compare_digest(str(obj["mac"]), self._index_mac(marks))
        except (ValueError, UnicodeDecodeError, KeyError, TypeError):
            ok = False
        if not ok:
            raise SealError(f"high-water index {path} is malformed or its MAC is "
                            "wrong")
        return marks

    @staticmethod
    def _folder_key(path: Path) -> str:
        """The index key of the folder holding ``path``: its absolute path,
        symlinks not resolved (the folder as the caller names it)."""
        return os.path.abspath(path.parent)

    # ---- sealing ---------------------------------------------------------------
    def mac(self, entry: SealedEntry) -> str:
        """HMAC-SHA256 (hex) of every field of ``entry`` but ``mac``."""
        return self._hmac(b"gpuhive.seal.entry", _mac_message(entry))

    def seal(
        self,
        source: str,
        binary: bytes,
        config_hash: str,
        options: Sequence[str],
        arch: str,
        compiler: str,
    ) -> SealedEntry:
        """Seal one compiled kernel, taking the next counter of this key.

        Raises:
            TypeError: a field of the wrong type, named.
            SealError: the counter file cannot be trusted.
        """
        for name, value in (("source", source), ("config_hash", config_hash),
                            ("arch", arch), ("compiler", compiler)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be str, got {type(value).__name__}")
        if not isinstance(binary, bytes | bytearray | memoryview):
            raise TypeError(f"binary must be bytes, got {type(binary).__name__}")
        if isinstance(options, str) or not all(isinstance(o, str) for o in options):
            raise TypeError("options must be a sequence of str")
        entry = SealedEntry(source, bytes(binary), config_hash, tuple(options), arch,
                            compiler, FORMAT_VERSION, self._next_counter(), "")
        return dataclasses.replace(entry, mac=self.mac(entry))

    def write(self, entry: SealedEntry, path: Path | str) -> bool:
        """Write ``entry`` to ``path`` atomically and raise the high-water
        mark of its folder and config hash in the index next to the key.

        Returns:
            ``True`` when written; ``False`` when a newer entry for the same
            config hash was already written to this folder (it is kept).

        Raises:
            SealError: ``entry`` does not verify under this key, or the
                high-water index is tampered.
        """
        path = Path(path)
        check = self.verify(entry, getattr(entry, "config_hash", ""))
        if not check.accepted:
            raise SealError(f"refusing to write {path}: {check.summary()}")
        try:
            make_folder(path.parent)
        except OSError as exc:
            raise SealError(f"cannot create cache folder {path.parent}: {exc}"
                            ) from exc
        data = _encode(entry)
        folder = self._folder_key(path)
        with _locked(self._lock_path):
            marks = self._read_index()
            row = marks.setdefault(folder, {})
            high = row.get(entry.config_hash, 0)
            if entry.counter < high:
                return False
            if entry.counter > high:
                # the mark first: a crash before the file is replaced leaves
                # an entry below its mark (refused, regenerated), never a
                # counter in a cache folder that no mark covers
                row[entry.config_hash] = entry.counter
                write_atomic(self.index_path, _canonical_json(
                    {"high_water": marks, "mac": self._index_mac(marks)}))
            write_atomic(path, data)
        return True

    # ---- verifying ---------------------------------------------------------------
    def _load_locked(self, path: Path, expected: str, target: Target | None,
                     ) -> tuple[SealedEntry | None, list[Violation]]:
        try:
            data = _read_small(path, MAX_ENTRY_BYTES)
        except OSError as exc:
            why = str(exc) if isinstance(exc, NotRegularError) else \
                f"{type(exc).__name__}: {exc.strerror or exc}"
            return None, [Violation("seal.io", f"cannot read {path}: {why:.120}")]
        entry, found = _parse(data)
        if entry is not None:
            found.extend(self._check(entry, expected, target))
        if entry is not None and not found:
            # Only a genuine entry's counter means anything.
            try:
                marks = self._read_index()
            except SealError as exc:
                found.append(Violation("seal.index", str(exc)))
            else:
                found.extend(self._freshness(entry, self._folder_key(path), marks))
        return entry, found

    def _check(self, entry: object, expected: object,
               target: Target | None = None) -> list[Violation]:
        if not isinstance(entry, SealedEntry):
            return [Violation("seal.format", f"expected a SealedEntry, got "
                              f"{type(entry).__name__}")]
        problems = _field_problems(entry)
        if problems:
            return [Violation("seal.format", p) for p in problems]
        found: list[Violation] = []
        if entry.format_version != FORMAT_VERSION:
            found.append(Violation("seal.format", f"format version "
                                   f"{entry.format_version}, expected "
                                   f"{FORMAT_VERSION}"))
        if entry.mac == "":
            found.append(Violation("seal.missing_mac", "entry carries no MAC"))
        elif not _HEX64_RE.fullmatch(entry.mac):
            found.append(Violation("seal.mac", "MAC is not 64 lowercase hex digits"))
        else:
            try:
                good = hmac.compare_digest(entry.mac, self.mac(entry))
            except UnicodeError:
                good = False
            if not good:
                found.append(Violation("seal.mac", f"MAC does not match the entry "
                                       f"for config hash {entry.config_hash[:64]!r}"
                                       " (changed, or sealed under another key)"))
        try:
            same = isinstance(expected, str) and hmac.compare_digest(
                entry.config_hash.encode("utf-8"), expected.encode("utf-8"))
        except UnicodeError:
            same = False
        if not same:
            found.append(Violation("seal.key_mismatch", f"entry is for config hash "
                                   f"{entry.config_hash[:64]!r}, expected "
                                   f"{str(expected)[:64]!r}"))
        if target is not None and not found:  # a genuine entry's fields only
            found.extend(_target_problems(entry, target))
        return found

    @staticmethod
    def _freshness(entry: SealedEntry, folder: str,
                   marks: dict[str, dict[str, int]]) -> list[Violation]:
        """Rollback and placement check of a genuine entry against the
        high-water index: its counter must be its folder's mark."""
        high = marks.get(folder, {}).get(entry.config_hash)
        if high is None:
            return [Violation("seal.rollback", f"no entry for config hash "
                              f"{entry.config_hash[:64]!r} was written to "
                              f"{folder[:200]} under this key (copied in?)")]
        if entry.counter < high:
            return [Violation("seal.rollback", f"counter {entry.counter} is below "
                              f"the newest {high} written to {folder[:200]} for "
                              f"config hash {entry.config_hash[:64]!r}")]
        if entry.counter > high:
            return [Violation("seal.placement", f"counter {entry.counter} was never "
                              f"written to {folder[:200]} (the entry last "
                              f"written there for config hash "
                              f"{entry.config_hash[:64]!r} has counter {high}): "
                              "copied in from another cache folder")]
        return []

    def verify(self, entry: SealedEntry, expected_config_hash: str,
               target: Target | None = None) -> Verdict:
        """Gate 2b on an entry in memory; never raises.

        Checks the format, the MAC (over every field), that the entry is for
        ``expected_config_hash`` and, when ``target`` is given, that a genuine
        entry was compiled for exactly that architecture, options and compiler
        (``seal.target``). Rollback needs the entry's folder and is checked by
        :meth:`load`.
        """
        start = time.perf_counter()
        try:
            found = self._check(entry, expected_config_hash, target)
        except Exception as exc:  # fail closed
            found = [Violation("seal.format", f"cannot verify: {exc!s:.80}")]
        return Verdict(GATE, tuple(found), time.perf_counter() - start)

    def load(
        self, path: Path | str, expected_config_hash: str,
        target: Target | None = None,
    ) -> tuple[SealedEntry | None, Verdict]:
        """Gate 2b on a file; never raises.

        A folder that others can write to is refused unread
        (``seal.folder``). On top of :meth:`verify`, an otherwise genuine
        entry is checked against the high-water index next to the key
        (``seal.rollback``, ``seal.placement``); an unreadable index is
        ``seal.index``. The file and the index are read under the key's lock
        (shared), so a concurrent :meth:`write` is seen whole or not at all.

        Returns:
            ``(entry, verdict)``; ``entry`` is ``None`` unless the verdict is
            accepted, so a rejected entry cannot be used by mistake.
        """
        start = time.perf_counter()
        found: list[Violation] = []
        entry: SealedEntry | None = None
        try:
            path = Path(path)
            problem = folder_problem(path.parent)
            if problem:
                found.append(Violation("seal.folder", problem))
            else:
                with _locked(self._lock_path, shared=True):
                    entry, found = self._load_locked(path, expected_config_hash,
                                                     target)
        except Exception as exc:  # fail closed
            found.append(Violation("seal.format", f"cannot load: {exc!s:.80}"))
        verdict = Verdict(GATE, tuple(found), time.perf_counter() - start)
        return (entry if verdict.accepted else None), verdict
