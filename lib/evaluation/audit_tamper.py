"""Gate 2b tamper operations: what an attacker can do to a sealed cache entry.

Each Gate 2b case in ``cases/gate2b.yaml`` names one operation of
:data:`TAMPERS` and gives its arguments. An operation seals a fresh entry of
:data:`SEAL_SOURCE` (kept in memory, or written to a file in the case's own
folder), tampers with it, and returns the gate call to time:
:meth:`Seal.verify` on the entry or :meth:`Seal.load` of the file. Everything
before that call is setup, untimed.

An operation takes the :class:`SealBench` and the case's folder first, then
its arguments by name; its signature is what the case's ``args`` are checked
against. The case's folder is made 0700 before the operation runs, as
:class:`~lib.codegen.KernelCache` makes its folder (the seal refuses a cache
folder others can write to, whatever the umask that created it).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lib.security.seal import MAX_ENTRY_BYTES, Seal, SealedEntry, make_target
from lib.security.verdict import Verdict

#: The config hash every entry is sealed for and asked for, and another one.
HASH_A = "a" * 64
HASH_B = "b" * 64
#: The kernel every sealed entry holds (the edits of its ``2.0f`` are flips).
SEAL_SOURCE = ('extern "C" __global__ void k(const float* x, float* y, int n) {\n'
               "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
               "    if (i < n) y[i] = 2.0f * x[i];\n"
               "}\n")
SEAL_OPTIONS = ("-arch=sm_90", "-O3")
#: The zero-argument gate call an operation returns.
GateCall = Callable[[], Verdict]
#: An operation: ``(bench, folder, **args) -> gate call``.
Tamper = Callable[..., GateCall]


@dataclass
class SealBench:
    """Our key, a stranger's, a spare one and a seeded byte picker.

    The spare key is for the case that corrupts a key's high-water index:
    done to ours, it would refuse every other case's entry too.
    """

    seal: Seal
    stranger: Seal
    spare: Seal
    rng: random.Random

    def entry(self, config_hash: str = HASH_A, by: Seal | None = None,
              binary: bytes = bytes(range(256)) * 4) -> SealedEntry:
        return (by or self.seal).seal(SEAL_SOURCE, binary, config_hash,
                                      SEAL_OPTIONS, "sm_90", "nvrtc 12.4")

    def written(self, folder: Path, entry: SealedEntry | None = None) -> Path:
        path = folder / "entry.sealed"
        self.seal.write(entry or self.entry(), path)
        return path

    def load(self, path: Path, expected: str = HASH_A) -> GateCall:
        return lambda: self.seal.load(path, expected)[1]

    def verify(self, entry: Any, expected: str = HASH_A) -> GateCall:
        return lambda: self.seal.verify(entry, expected)


#: Operation name -> operation, filled by :func:`_tamper`.
TAMPERS: dict[str, Tamper] = {}


def _tamper(op: Tamper) -> Tamper:
    """Register ``op`` under its own name (run with its folder made 0700)."""
    @functools.wraps(op)
    def run(b: SealBench, folder: Path, **args: Any) -> GateCall:
        os.chmod(folder, 0o700)
        return op(b, folder, **args)

    TAMPERS[op.__name__] = run
    return op


def flip_hex(digest: str) -> str:
    """``digest`` with its first hex digit changed."""
    return ("0" if digest[0] != "0" else "1") + digest[1:]


# ---------------------------------------------------------------------------
# In memory: the entry object handed to Seal.verify

def _verify_edited(b: SealBench, field: str, edit: Callable[[Any], Any]) -> GateCall:
    """Verify a fresh entry whose ``field`` was changed by ``edit``."""
    e = b.entry()
    return b.verify(dataclasses.replace(e, **{field: edit(getattr(e, field))}))


@_tamper
def verify_fresh(b: SealBench, folder: Path) -> GateCall:
    """A fresh entry, untouched (a control)."""
    return b.verify(b.entry())


@_tamper
def set_field(b: SealBench, folder: Path, field: str, value: Any) -> GateCall:
    """A fresh entry with ``field`` set to ``value``."""
    return _verify_edited(b, field, lambda old: value)


@_tamper
def replace_in_field(b: SealBench, folder: Path, field: str, old: str,
                     new: str) -> GateCall:
    """A fresh entry with ``old`` replaced by ``new`` in text ``field``."""
    return _verify_edited(b, field, lambda text: text.replace(old, new))


@_tamper
def flip_first_digit(b: SealBench, folder: Path, field: str) -> GateCall:
    """A fresh entry with the first hex digit of ``field`` changed."""
    return _verify_edited(b, field, flip_hex)


@_tamper
def uppercase_field(b: SealBench, folder: Path, field: str) -> GateCall:
    """A fresh entry with text ``field`` in upper case."""
    return _verify_edited(b, field, str.upper)


@_tamper
def add_to_field(b: SealBench, folder: Path, field: str, amount: int) -> GateCall:
    """A fresh entry with ``amount`` added to number ``field``."""
    return _verify_edited(b, field, lambda old: old + amount)


@_tamper
def append_to_field(b: SealBench, folder: Path, field: str, item: Any) -> GateCall:
    """A fresh entry with ``item`` appended to tuple ``field``."""
    return _verify_edited(b, field, lambda old: old + (item,))


@_tamper
def flip_random_binary_bit(b: SealBench, folder: Path) -> GateCall:
    """Flip the lowest bit of one byte of the binary, picked by the seeded rng."""
    e = b.entry()
    pos = b.rng.randrange(len(e.binary))
    raw = bytearray(e.binary)
    raw[pos] ^= 0x01
    return b.verify(dataclasses.replace(e, binary=bytes(raw)))


@_tamper
def verify_other_config(b: SealBench, folder: Path) -> GateCall:
    """A genuine entry sealed for config B, offered for config A."""
    return b.verify(b.entry(HASH_B), HASH_A)


@_tamper
def relabel_config_hash(b: SealBench, folder: Path) -> GateCall:
    """An entry sealed for config B with its label changed to A."""
    return b.verify(dataclasses.replace(b.entry(HASH_B), config_hash=HASH_A))


@_tamper
def verify_foreign(b: SealBench, folder: Path) -> GateCall:
    """An entry sealed under a stranger's key."""
    return b.verify(b.entry(by=b.stranger))


@_tamper
def verify_value(b: SealBench, folder: Path, value: Any) -> GateCall:
    """Something that is not a sealed entry at all."""
    return b.verify(value)


# ---------------------------------------------------------------------------
# On disk: the entry file in the case's folder, read by Seal.load

def _edit_file(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    if data.count(old) != 1:
        raise ValueError(f"{path}: expected one {old!r} to replace, found "
                         f"{data.count(old)}")
    path.write_bytes(data.replace(old, new))


def _rewrite_body(path: Path, edit: Callable[[dict], Any]) -> None:
    """Re-encode the entry file canonically after ``edit`` changes its body."""
    head, body = path.read_bytes().split(b"\n", 1)
    obj = json.loads(body)
    edit(obj)
    body = json.dumps(obj, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True).encode("ascii")
    path.write_bytes(b" ".join(head.split(b" ")[:2]) + f" {len(body)}\n".encode()
                     + body)


def _folder_files(folder: Path) -> dict[Path, bytes]:
    """Every file the attacker can reach in a cache folder, with its bytes."""
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@_tamper
def load_fresh(b: SealBench, folder: Path) -> GateCall:
    """A fresh entry file, untouched (a control)."""
    return b.load(b.written(folder))


@_tamper
def replace_in_file(b: SealBench, folder: Path, old: str, new: str) -> GateCall:
    """Replace the one occurrence of ``old`` in the file's bytes."""
    path = b.written(folder)
    _edit_file(path, old.encode(), new.encode())
    return b.load(path)


@_tamper
def flip_binary_in_file(b: SealBench, folder: Path) -> GateCall:
    """Change the first base64 character of the binary (re-encoded canonically)."""
    path = b.written(folder)
    _rewrite_body(path, lambda o: o.update(binary="B" + o["binary"][1:]))
    return b.load(path)


@_tamper
def flip_mac_in_file(b: SealBench, folder: Path) -> GateCall:
    """Change the first digit of the MAC in the file (re-encoded canonically)."""
    path = b.written(folder)
    _rewrite_body(path, lambda o: o.update(mac=flip_hex(o["mac"])))
    return b.load(path)


@_tamper
def drop_from_file(b: SealBench, folder: Path, field: str) -> GateCall:
    """Remove ``field`` from the file's body (re-encoded canonically)."""
    path = b.written(folder)
    _rewrite_body(path, lambda o: o.pop(field))
    return b.load(path)


@_tamper
def load_other_config(b: SealBench, folder: Path) -> GateCall:
    """A genuine file sealed for config B, loaded as config A."""
    path = b.written(folder, b.entry(HASH_B))
    return b.load(path, HASH_A)


@_tamper
def rollback(b: SealBench, folder: Path) -> GateCall:
    """Write an old entry, then a new one, and put the old bytes back."""
    path = b.written(folder, b.entry(binary=b"old, vulnerable build"))
    old = path.read_bytes()
    b.written(folder, b.entry(binary=b"new, fixed build"))
    path.write_bytes(old)
    return b.load(path)


@_tamper
def rollback_copy(b: SealBench, folder: Path) -> GateCall:
    """The old entry's bytes under another file name next to the new one."""
    old = b.written(folder, b.entry(binary=b"old build")).read_bytes()
    b.written(folder, b.entry(binary=b"new build"))
    copy = folder / "other-name.sealed"
    copy.write_bytes(old)
    return b.load(copy)


@_tamper
def rollback_index_deleted(b: SealBench, folder: Path) -> GateCall:
    """Put the old entry back and delete every other file in the cache folder
    (a high-water index kept there would go with them)."""
    call = rollback(b, folder)
    for p in _folder_files(folder):
        if p.name != "entry.sealed":
            p.unlink()
    return call


@_tamper
def rollback_old_index(b: SealBench, folder: Path) -> GateCall:
    """Snapshot the whole cache folder after the old write and restore it after
    the new one (an index kept there would be restored with the entry)."""
    path = b.written(folder, b.entry(binary=b"old, vulnerable build"))
    snapshot = _folder_files(folder)
    b.written(folder, b.entry(binary=b"new, fixed build"))
    for p in _folder_files(folder):
        if p not in snapshot:
            p.unlink()
    for p, data in snapshot.items():
        p.write_bytes(data)
    return b.load(path)


@_tamper
def truncate(b: SealBench, folder: Path, keep: int | str) -> GateCall:
    """Cut the file to its first ``keep`` bytes (``"half"``: half of them)."""
    if keep != "half" and (type(keep) is not int or keep < 0):
        raise ValueError(f"keep must be a byte count >= 0 or 'half', got {keep!r}")
    path = b.written(folder)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2 if keep == "half" else keep])
    return b.load(path)


@_tamper
def append_to_file(b: SealBench, folder: Path, text: str) -> GateCall:
    """Append ``text`` to the file."""
    path = b.written(folder)
    path.write_bytes(path.read_bytes() + text.encode())
    return b.load(path)


@_tamper
def overwrite_file_start(b: SealBench, folder: Path, text: str) -> GateCall:
    """Write ``text`` over the file's first bytes (its header)."""
    path = b.written(folder)
    head = text.encode()
    path.write_bytes(head + path.read_bytes()[len(head):])
    return b.load(path)


@_tamper
def load_foreign(b: SealBench, folder: Path) -> GateCall:
    """A file sealed and written under a stranger's key, copied into place."""
    theirs = folder / "theirs"
    b.stranger.write(b.entry(by=b.stranger), theirs / "entry.sealed")
    path = folder / "entry.sealed"
    path.write_bytes((theirs / "entry.sealed").read_bytes())
    return b.load(path)


@_tamper
def lower_index_marks(b: SealBench, folder: Path) -> GateCall:
    """Lower the marks in the high-water index next to the (spare) key.

    The index lives in the trusted key folder, out of the cache attacker's
    reach; this is corruption, or an attacker without the key who got in
    there. Either way the index MAC must refuse it."""
    path = folder / "entry.sealed"
    b.spare.write(b.entry(by=b.spare), path)
    index = b.spare.index_path
    obj = json.loads(index.read_bytes())
    obj["high_water"] = {f: {k: 0 for k in row}
                         for f, row in obj["high_water"].items()}
    index.write_bytes(json.dumps(obj).encode())
    return lambda: b.spare.load(path, HASH_A)[1]


@_tamper
def load_through_symlink(b: SealBench, folder: Path) -> GateCall:
    """Load a genuine entry file through a symlink to it."""
    real = b.written(folder)
    link = folder / "link.sealed"
    os.symlink(real, link)
    return b.load(link)


@_tamper
def load_missing(b: SealBench, folder: Path) -> GateCall:
    """Load a file that is not there."""
    return b.load(folder / "absent.sealed")


@_tamper
def load_fifo(b: SealBench, folder: Path) -> GateCall:
    """A FIFO where the entry file should be (opening it for reading would
    wait for a writer forever)."""
    path = folder / "entry.sealed"
    os.mkfifo(path, 0o600)
    return b.load(path)


@_tamper
def grow_sparse(b: SealBench, folder: Path) -> GateCall:
    """Extend a genuine entry file, sparsely, to one byte over the size limit
    (no disk used; reading it would fill memory with zeros)."""
    path = b.written(folder)
    os.truncate(path, MAX_ENTRY_BYTES + 1)
    return b.load(path)


@_tamper
def load_for_target(b: SealBench, folder: Path, arch: str | None = None,
                    compiler: str | None = None,
                    extra_option: str | None = None) -> GateCall:
    """Load a genuine entry (sm_90, SEAL_OPTIONS, nvrtc 12.4) asking for a
    target with ``arch``, ``compiler`` or one more option instead; with no
    arguments, asking for exactly what was sealed."""
    path = b.written(folder)
    options = SEAL_OPTIONS + ((extra_option,) if extra_option else ())
    target = make_target(arch or "sm_90", options, compiler or "nvrtc 12.4")
    return lambda: b.seal.load(path, HASH_A, target)[1]


@_tamper
def copy_from_other_folder(b: SealBench, folder: Path) -> GateCall:
    """Two cache folders under the same key, each with its entry for config A;
    the newer one's file copied over the older one's."""
    mine, theirs = folder / "one" / "entry.sealed", folder / "two" / "entry.sealed"
    b.seal.write(b.entry(binary=b"built for folder one"), mine)
    b.seal.write(b.entry(binary=b"built for folder two"), theirs)
    shutil.copyfile(theirs, mine)
    return b.load(mine)


@_tamper
def loosen_folder(b: SealBench, folder: Path, mode: str) -> GateCall:
    """A genuine entry file whose cache folder is then given ``mode`` (octal
    text, e.g. ``"0775"``)."""
    path = b.written(folder)
    os.chmod(folder, int(mode, 8))
    return b.load(path)


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """``logger`` silenced for a setup that warns on purpose."""
    log = logging.getLogger(logger)
    was, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = was


@_tamper
def rollback_counter_deleted(b: SealBench, folder: Path) -> GateCall:
    """Under a key of the case's own: write an old entry, delete the counter
    file next to the key, write a new entry, put the old bytes back. (A
    counter that restarted at 1 would make the new entry look older than the
    old one, so it would never be written and the old one would stand.)"""
    seal = Seal(folder / "keys" / "seal.key")
    path = folder / "cache" / "entry.sealed"
    seal.write(b.entry(by=seal, binary=b"old, vulnerable build"), path)
    old = path.read_bytes()
    (folder / "keys" / "seal.key.counter").unlink()
    with _quiet("lib.security"):  # the seal warns of the repair
        seal.write(b.entry(by=seal, binary=b"new, fixed build"), path)
    path.write_bytes(old)
    return lambda: seal.load(path, HASH_A)[1]
