"""Gate 2b: the integrity seal on cached kernels."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lib.codegen.cache import KernelCache, cache_key
from lib.security import seal as seal_module
from lib.security.seal import (
    FORMAT_VERSION,
    MAGIC,
    MAX_ENTRY_BYTES,
    Seal,
    SealedEntry,
    SealError,
    folder_problem,
    make_target,
)

SOURCE = 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }\n'
BINARY = bytes(range(256)) * 2
HASH_A = "a" * 64
HASH_B = "b" * 64
OPTIONS = ("-arch=sm_90", "-O3")


@pytest.fixture
def seal(tmp_path: Path) -> Seal:
    return Seal(tmp_path / "keys" / "seal.key")


def make(seal: Seal, config_hash: str = HASH_A, binary: bytes = BINARY) -> SealedEntry:
    return seal.seal(SOURCE, binary, config_hash, OPTIONS, "sm_90", "nvrtc 12.4")


# ---- the key -----------------------------------------------------------------


def test_key_file_is_created_with_mode_0600(tmp_path):
    key = tmp_path / "k" / "seal.key"
    Seal(key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.stat().st_size == 32


def test_key_is_reused_across_instances(tmp_path):
    key = tmp_path / "seal.key"
    entry = make(Seal(key))
    assert Seal(key).verify(entry, HASH_A).accepted


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o400, 0o700])
def test_key_file_with_another_mode_is_refused(tmp_path, mode):
    key = tmp_path / "seal.key"
    Seal(key)
    os.chmod(key, mode)
    with pytest.raises(SealError) as err:
        Seal(key)
    assert str(key) in str(err.value)
    assert f"{mode:04o}" in str(err.value)


def test_key_file_of_the_wrong_size_is_refused(tmp_path):
    key = tmp_path / "seal.key"
    key.write_bytes(b"short")
    os.chmod(key, 0o600)
    with pytest.raises(SealError, match="holds 5 bytes"):
        Seal(key)


def test_key_file_symlink_is_refused(tmp_path):
    real = tmp_path / "real.key"
    Seal(real)
    link = tmp_path / "link.key"
    link.symlink_to(real)
    with pytest.raises(SealError, match="link.key"):
        Seal(link)


# ---- a good entry ---------------------------------------------------------------


def test_good_entry_verifies_and_round_trips(seal, tmp_path):
    entry = make(seal)
    assert entry.format_version == FORMAT_VERSION
    assert len(entry.mac) == 64
    assert seal.verify(entry, HASH_A).accepted
    path = tmp_path / "cache" / "a.sealed"
    assert seal.write(entry, path) is True
    loaded, verdict = seal.load(path, HASH_A)
    assert verdict.accepted, verdict.violations
    assert verdict.gate == "gate2b"
    assert loaded == entry


def test_counter_is_monotonic_and_persisted(tmp_path):
    key = tmp_path / "seal.key"
    first = [make(Seal(key)).counter for _ in range(3)]
    assert first == [1, 2, 3]
    assert make(Seal(key)).counter == 4


def test_tampered_counter_file_is_refused(tmp_path):
    key = tmp_path / "seal.key"
    make(Seal(key))
    counter = tmp_path / "seal.key.counter"
    obj = json.loads(counter.read_text())
    obj["counter"] = 0
    counter.write_text(json.dumps(obj))
    with pytest.raises(SealError, match="counter"):
        make(Seal(key))


def test_atomic_write_leaves_no_temporary_files(seal, tmp_path):
    folder = tmp_path / "cache"
    for n in range(5):
        seal.write(make(seal, binary=bytes([n]) * 10), folder / "a.sealed")
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["a.sealed"]  # no bookkeeping in the cache folder
    keys = sorted(p.name for p in (tmp_path / "keys").iterdir())
    assert keys == ["seal.key", "seal.key.counter", "seal.key.index",
                    "seal.key.lock"]


def test_index_lives_next_to_the_key_with_mode_0600(seal, tmp_path):
    seal.write(make(seal), tmp_path / "cache" / "a.sealed")
    assert seal.index_path == tmp_path / "keys" / "seal.key.index"
    assert stat.S_IMODE(seal.index_path.stat().st_mode) == 0o600
    marks = json.loads(seal.index_path.read_text())["high_water"]
    assert marks == {str(tmp_path / "cache"): {HASH_A: 1}}


# ---- attacks --------------------------------------------------------------------


def _flip(data: bytes, offset: int, mask: int = 0x01) -> bytes:
    return data[:offset] + bytes([data[offset] ^ mask]) + data[offset + 1:]


@pytest.mark.parametrize(
    "field", ["source", "binary", "options", "arch", "compiler", "counter", "mac"]
)
def test_a_changed_field_breaks_the_mac(seal, field):
    entry = make(seal)
    value = getattr(entry, field)
    if field == "binary":
        changed = _flip(value, 100)
    elif field == "options":
        changed = ("-arch=sm_90", "-O2")
    elif field == "counter":
        changed = value + 1
    elif field == "mac":
        changed = ("0" if value[0] != "0" else "1") + value[1:]
    else:
        changed = value[:-1] + chr(ord(value[-1]) ^ 1)
    verdict = seal.verify(dataclasses.replace(entry, **{field: changed}), HASH_A)
    assert verdict.checks == ("seal.mac",)


def test_changed_config_hash_breaks_the_mac_and_the_key(seal):
    entry = dataclasses.replace(make(seal), config_hash=HASH_B)
    verdict = seal.verify(entry, HASH_A)
    assert verdict.checks == ("seal.mac", "seal.key_mismatch")


def test_every_flipped_byte_in_the_file_is_detected(seal, tmp_path):
    path = tmp_path / "cache" / "a.sealed"
    entry = seal.seal("k", b"\x00\x01\x02\xff", HASH_A, OPTIONS, "sm_90", "nvrtc")
    seal.write(entry, path)
    good = path.read_bytes()
    allowed = {"seal.mac", "seal.format", "seal.truncated", "seal.missing_mac",
               "seal.key_mismatch", "seal.rollback"}  # a changed counter digit
    for mask in (0x01, 0x20, 0x80):
        for offset in range(len(good)):
            path.write_bytes(_flip(good, offset, mask))
            loaded, verdict = seal.load(path, HASH_A)
            assert not verdict.accepted, (offset, mask)
            assert loaded is None
            assert set(verdict.checks) <= allowed, (offset, mask, verdict.checks)


def test_flipped_byte_in_the_binary_field_of_the_file_is_a_mac_failure(seal,
                                                                       tmp_path):
    path = tmp_path / "cache" / "a.sealed"
    seal.write(make(seal), path)
    data = path.read_bytes()
    start = data.index(b'"binary":"') + len(b'"binary":"')
    # 'A' <-> 'B' in base64 changes one decoded bit, still canonical base64.
    offset = data.index(b"A", start)
    path.write_bytes(data[:offset] + b"B" + data[offset + 1:])
    assert seal.load(path, HASH_A)[1].checks == ("seal.mac",)


def test_entry_under_another_key_fails_the_mac(seal, tmp_path):
    other = Seal(tmp_path / "other" / "seal.key")
    verdict = other.verify(make(seal), HASH_A)
    assert verdict.checks == ("seal.mac",)


def test_entries_swapped_between_cache_keys(seal, tmp_path):
    folder = tmp_path / "cache"
    seal.write(make(seal, HASH_A), folder / "a.sealed")
    seal.write(make(seal, HASH_B), folder / "b.sealed")
    (folder / "b.sealed").write_bytes((folder / "a.sealed").read_bytes())
    loaded, verdict = seal.load(folder / "b.sealed", HASH_B)
    assert verdict.checks == ("seal.key_mismatch",)
    assert loaded is None


def test_rollback_to_an_older_valid_entry(seal, tmp_path):
    path = tmp_path / "cache" / "a.sealed"
    seal.write(make(seal, binary=b"old"), path)
    old = path.read_bytes()
    seal.write(make(seal, binary=b"new"), path)
    assert seal.load(path, HASH_A)[1].accepted
    path.write_bytes(old)
    loaded, verdict = seal.load(path, HASH_A)
    assert verdict.checks == ("seal.rollback",)
    assert loaded is None


def test_write_keeps_the_newer_entry(seal, tmp_path):
    path = tmp_path / "cache" / "a.sealed"
    older, newer = make(seal, binary=b"old"), make(seal, binary=b"new")
    assert seal.write(newer, path) is True
    assert seal.write(older, path) is False
    assert seal.load(path, HASH_A)[0].binary == b"new"


def _cache_files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_rollback_with_the_cache_folder_emptied_around_it(seal, tmp_path):
    folder = tmp_path / "cache"
    path = folder / "a.sealed"
    seal.write(make(seal, binary=b"old"), path)
    old = path.read_bytes()
    seal.write(make(seal, binary=b"new"), path)
    path.write_bytes(old)
    for p in _cache_files(folder):
        if p != path:
            p.unlink()
    assert seal.load(path, HASH_A)[1].checks == ("seal.rollback",)


def test_rollback_with_the_whole_cache_folder_restored(seal, tmp_path):
    folder = tmp_path / "cache"
    path = folder / "a.sealed"
    seal.write(make(seal, binary=b"old"), path)
    snapshot = _cache_files(folder)
    seal.write(make(seal, binary=b"new"), path)
    for p in _cache_files(folder):
        if p not in snapshot:
            p.unlink()
    for p, data in snapshot.items():
        p.write_bytes(data)
    assert seal.load(path, HASH_A)[1].checks == ("seal.rollback",)


def test_a_stale_index_file_in_the_cache_folder_is_ignored(seal, tmp_path):
    folder = tmp_path / "cache"
    seal.write(make(seal, binary=b"old"), folder / "a.sealed")
    old = (folder / "a.sealed").read_bytes()
    seal.write(make(seal, binary=b"new"), folder / "a.sealed")
    (folder / "a.sealed").write_bytes(old)
    (folder / ".seal-index.json").write_text('{"high_water": {}, "mac": ""}')
    assert seal.load(folder / "a.sealed", HASH_A)[1].checks == ("seal.rollback",)


def test_entry_copied_into_a_folder_it_was_never_written_to(seal, tmp_path):
    seal.write(make(seal), tmp_path / "cache" / "a.sealed")
    other = tmp_path / "elsewhere" / "a.sealed"
    other.parent.mkdir(mode=0o700)
    other.write_bytes((tmp_path / "cache" / "a.sealed").read_bytes())
    loaded, verdict = seal.load(other, HASH_A)
    assert verdict.checks == ("seal.rollback",)
    assert loaded is None
    assert seal.load(tmp_path / "cache" / "a.sealed", HASH_A)[1].accepted


def test_each_folder_keeps_its_own_marks(seal, tmp_path):
    first, second = tmp_path / "one" / "a.sealed", tmp_path / "two" / "a.sealed"
    seal.write(make(seal, binary=b"older"), first)
    seal.write(make(seal, binary=b"newer"), second)
    assert seal.load(first, HASH_A)[1].accepted
    assert seal.load(second, HASH_A)[1].accepted


def test_tampered_index_is_reported(seal, tmp_path):
    folder = tmp_path / "cache"
    seal.write(make(seal), folder / "a.sealed")
    index = json.loads(seal.index_path.read_text())
    index["high_water"][str(folder)][HASH_A] = 0
    seal.index_path.write_text(json.dumps(index))
    assert seal.load(folder / "a.sealed", HASH_A)[1].checks == ("seal.index",)
    with pytest.raises(SealError, match="high-water index"):
        seal.write(make(seal), folder / "a.sealed")


@pytest.mark.parametrize("keep", [0, 5, len(MAGIC) + 3, 40, -200, -1])
def test_truncated_file(seal, tmp_path, keep):
    path = tmp_path / "cache" / "a.sealed"
    seal.write(make(seal), path)
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    loaded, verdict = seal.load(path, HASH_A)
    assert verdict.checks == ("seal.truncated",)
    assert loaded is None


def test_entry_without_a_mac(seal, tmp_path):
    entry = make(seal)
    assert seal.verify(dataclasses.replace(entry, mac=""), HASH_A).checks == (
        "seal.missing_mac",
    )
    path = tmp_path / "cache" / "a.sealed"
    seal.write(entry, path)
    header, body = path.read_bytes().split(b"\n", 1)
    obj = json.loads(body)
    del obj["mac"]
    body = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(MAGIC + f" {FORMAT_VERSION} {len(body)}\n".encode() + body)
    assert seal.load(path, HASH_A)[1].checks == ("seal.missing_mac",)


def test_write_refuses_an_unsealed_entry(seal, tmp_path):
    entry = dataclasses.replace(make(seal), mac="")
    with pytest.raises(SealError, match="seal.missing_mac"):
        seal.write(entry, tmp_path / "cache" / "a.sealed")


@pytest.mark.parametrize(
    ("content", "check"),
    [
        (None, "seal.io"),
        ("folder", "seal.io"),
        (b"", "seal.truncated"),
        (b"hello world\n{}", "seal.format"),
        (MAGIC + b" 2 2\n{}", "seal.format"),
        (MAGIC + b" 1 2\n{}", "seal.format"),
        (MAGIC + b" 1 4\n[1]x", "seal.format"),
        (MAGIC + b" 1 2\n{}trailing", "seal.format"),
    ],
)
def test_bad_files_never_raise(seal, tmp_path, content, check):
    path = tmp_path / "bad.sealed"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    loaded, verdict = seal.load(path, HASH_A)
    assert loaded is None
    assert verdict.checks == (check,)


def test_verify_never_raises_on_garbage(seal):
    for thing in (None, "entry", 3, dataclasses.replace(make(seal), binary="x")):
        assert seal.verify(thing, HASH_A).checks == ("seal.format",)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes_never_load(seal, tmp_path, data):
    path = tmp_path / "fuzz.sealed"
    path.write_bytes(MAGIC + b" 1 " + str(len(data)).encode() + b"\n" + data)
    loaded, verdict = seal.load(path, HASH_A)
    assert loaded is None
    assert not verdict.accepted


# ---- concurrency ------------------------------------------------------------------


def _writer(key: str, path: str, tag: bytes, rounds: int, barrier, queue) -> None:
    barrier.wait()  # both processes create the key and write at the same time
    seal = Seal(Path(key))
    counters = []
    for n in range(rounds):
        entry = seal.seal(SOURCE, tag * (n + 1), HASH_A, OPTIONS, "sm_90", "nvrtc")
        seal.write(entry, Path(path))
        counters.append(entry.counter)
    queue.put(counters)


def test_concurrent_writes_leave_one_valid_entry(tmp_path):
    # spawned: forking a process that runs threads is deprecated (Python 3.12+)
    ctx = multiprocessing.get_context("spawn")
    key, path = tmp_path / "keys" / "seal.key", tmp_path / "cache" / "a.sealed"
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    rounds = 15
    procs = [
        ctx.Process(target=_writer, args=(str(key), str(path), tag, rounds, barrier,
                                          queue))
        for tag in (b"A", b"B")
    ]
    for p in procs:
        p.start()
    counters = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    flat = sorted(counters[0] + counters[1])
    assert flat == list(range(1, 2 * rounds + 1))  # unique across processes
    seal = Seal(key)
    loaded, verdict = seal.load(path, HASH_A)
    assert verdict.accepted, verdict.violations
    assert loaded.counter == 2 * rounds  # the newest entry stands
    assert set(loaded.binary) <= {ord("A"), ord("B")}
    leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []



# ---- files that are not entries: refused without blocking, by size unread -------


def _unblocked(call, fifo: Path, timeout: float = 5.0):
    """``call()``'s result or exception, run in a thread; ``"blocked"`` when it
    waits on ``fifo`` (then a writer is opened so the thread ends)."""
    box: list = []

    def run():
        try:
            box.append(call())
        except Exception as exc:  # handed back to the test
            box.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout)
        return "blocked"
    return box[0]


def test_a_fifo_entry_is_refused_without_blocking(seal, tmp_path):
    path = tmp_path / "cache" / "a.sealed"
    path.parent.mkdir(mode=0o700)
    os.mkfifo(path, 0o600)
    result = _unblocked(lambda: seal.load(path, HASH_A), path)
    assert result != "blocked", "Seal.load blocked on a FIFO"
    loaded, verdict = result
    assert loaded is None and verdict.checks == ("seal.io",)
    assert "a FIFO, not a regular file" in verdict.violations[0].message
    assert str(path) in verdict.violations[0].message


def test_a_fifo_key_or_counter_is_refused_without_blocking(tmp_path):
    key = tmp_path / "keys" / "seal.key"
    key.parent.mkdir(mode=0o700)
    os.mkfifo(key, 0o600)
    result = _unblocked(lambda: Seal(key), key)
    assert isinstance(result, SealError), result
    assert "not a regular file" in str(result)
    key.unlink()
    seal = Seal(key)
    counter = tmp_path / "keys" / "seal.key.counter"
    os.mkfifo(counter, 0o600)
    result = _unblocked(lambda: make(seal), counter)
    assert isinstance(result, SealError), result
    assert "counter file" in str(result) and "a FIFO" in str(result)


def test_an_oversize_sparse_file_is_refused_unread(seal, tmp_path, monkeypatch):
    path = tmp_path / "cache" / "a.sealed"
    seal.write(make(seal), path)
    os.truncate(path, MAX_ENTRY_BYTES + 1)  # sparse: no disk, no memory
    reads = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or
                        real_read(fd, n))
    loaded, verdict = seal.load(path, HASH_A)
    assert loaded is None and verdict.checks == ("seal.io",)
    assert f"holds {MAX_ENTRY_BYTES + 1} bytes" in verdict.summary()
    assert reads == []
    assert MAX_ENTRY_BYTES <= 64 << 20


def test_a_file_that_grows_while_read_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "grows"
    path.write_bytes(b"x" * 300)
    real_fstat = os.fstat

    def smaller(fd):  # the size when opened; the file grew since
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink,
                               st.st_uid, st.st_gid, 50, st.st_atime,
                               st.st_mtime, st.st_ctime))

    monkeypatch.setattr(os, "fstat", smaller)
    with pytest.raises(OSError, match="grew past the limit of 100 bytes"):
        seal_module._read_small(path, 100)
    monkeypatch.setattr(os, "fstat", real_fstat)
    assert seal_module._read_small(path, 300) == b"x" * 300


# ---- the target: architecture, options, compiler ---------------------------------


def test_a_genuine_entry_for_another_target_is_refused(seal, tmp_path):
    path = tmp_path / "cache" / "a.sealed"
    seal.write(make(seal), path)  # sm_90, OPTIONS, nvrtc 12.4
    same = make_target("sm_90", OPTIONS, "nvrtc 12.4")
    assert seal.load(path, HASH_A, same)[1].accepted
    for target, what in [
        (make_target("sm_80", OPTIONS, "nvrtc 12.4"), "arch 'sm_90', asked 'sm_80'"),
        (make_target("sm_90", OPTIONS[:1], "nvrtc 12.4"), "options"),
        (make_target("sm_90", OPTIONS, "nvrtc 12.9"), "compiler"),
    ]:
        loaded, verdict = seal.load(path, HASH_A, target)
        assert loaded is None and verdict.checks == ("seal.target",), what
        assert what in verdict.summary()
        assert seal.verify(make(seal), HASH_A, target).checks == ("seal.target",)
    # a forged field is the MAC's to catch, not reported as a target mismatch
    forged = dataclasses.replace(make(seal), arch="sm_80")
    assert seal.verify(forged, HASH_A, same).checks == ("seal.mac",)


def test_cache_key_binds_arch_options_and_compiler():
    base = {"arch": "compute_80", "options": ("--std=c++17",), "compiler": "nvrtc 12.9"}
    key = cache_key(HASH_A, "template", None, "v1", **base)
    assert len(key) == 64
    for field, value in [("arch", "compute_90"), ("options", ("--std=c++14",)),
                         ("options", ()), ("compiler", "nvrtc 12.4")]:
        assert cache_key(HASH_A, "template", None, "v1",
                         **{**base, field: value}) != key, field
    assert cache_key(HASH_A, "template", None, "v1",
                     **{**base, "options": list(base["options"])}) == key
    with pytest.raises(TypeError, match="arch"):
        cache_key(HASH_A, "template", None, "v1")  # the old call binds nothing
    with pytest.raises(TypeError, match="options must be a sequence of str"):
        cache_key(HASH_A, "template", None, "v1", **{**base, "options": "-O3"})


def _cache(tmp_path: Path) -> KernelCache:
    return KernelCache(tmp_path / "kernels", tmp_path / "keys" / "seal.key")


TARGET_80 = {"arch": "compute_80", "options": ("--gpu-architecture=compute_80",),
             "compiler": "nvrtc 12.9"}


def test_kernel_cache_serves_only_the_asked_target(tmp_path, caplog):
    cache = _cache(tmp_path)
    key = cache_key(HASH_A, "template", None, "v1", **TARGET_80)
    cache.put(key, SOURCE, "// sm_90 ptx", ("--gpu-architecture=compute_90",),
              "compute_90", "nvrtc 12.9")  # a put that does not match its key
    with caplog.at_level(logging.WARNING, logger="lib.codegen"):
        entry, verdict = cache.get(key, **TARGET_80)
    assert entry is None and verdict.checks == ("seal.target",)
    assert "evicted" in caplog.text and not cache.path(key).exists()
    cache.put(key, SOURCE, "// sm_80 ptx", TARGET_80["options"], "compute_80",
              "nvrtc 12.9")
    entry, verdict = cache.get(key, **TARGET_80)
    assert verdict.accepted and entry.binary == b"// sm_80 ptx"
    assert cache.get(key)[1].accepted  # no target given: not compared
    with pytest.raises(TypeError, match="all of arch, options and compiler"):
        cache.get(key, arch="compute_80")


# ---- an entry is bound to its cache folder ---------------------------------------


def test_entry_copied_from_another_folder_under_the_same_key(seal, tmp_path):
    mine, theirs = tmp_path / "one" / "a.sealed", tmp_path / "two" / "a.sealed"
    seal.write(make(seal, binary=b"mine"), mine)
    seal.write(make(seal, binary=b"theirs, newer"), theirs)
    shutil.copyfile(theirs, mine)
    loaded, verdict = seal.load(mine, HASH_A)
    assert loaded is None and verdict.checks == ("seal.placement",)
    assert "copied in from another cache folder" in verdict.summary()
    assert seal.load(theirs, HASH_A)[1].accepted


def test_the_same_entry_written_to_two_folders_loads_in_both(seal, tmp_path):
    entry = make(seal)
    for folder in ("one", "two"):
        seal.write(entry, tmp_path / folder / "a.sealed")
    for folder in ("one", "two"):
        assert seal.load(tmp_path / folder / "a.sealed", HASH_A)[1].accepted


def test_a_crash_between_mark_and_file_leaves_an_entry_that_is_refused(
        seal, tmp_path, monkeypatch):
    path = tmp_path / "cache" / "a.sealed"
    seal.write(make(seal, binary=b"old"), path)
    real = seal_module.write_atomic

    def crash_on_entry(target, data, **kw):
        if Path(target) == path:
            raise OSError("disk full")
        return real(target, data, **kw)

    monkeypatch.setattr(seal_module, "write_atomic", crash_on_entry)
    with pytest.raises(OSError):
        seal.write(make(seal, binary=b"new"), path)
    assert seal.load(path, HASH_A)[1].checks == ("seal.rollback",)


# ---- the counter is never issued twice -------------------------------------------


def test_a_deleted_counter_file_does_not_make_writes_vanish(tmp_path, caplog):
    key = tmp_path / "keys" / "seal.key"
    seal = Seal(key)
    path = tmp_path / "cache" / "a.sealed"
    for n in range(3):
        seal.write(make(seal, binary=bytes([n])), path)
    (tmp_path / "keys" / "seal.key.counter").unlink()
    with caplog.at_level(logging.WARNING, logger="lib.security"):
        newer = make(Seal(key), binary=b"after the counter was lost")
    assert newer.counter == 4
    assert "seal.key.counter is missing" in caplog.text
    assert "records counter 3; continuing from 4" in caplog.text
    assert seal.write(newer, path) is True
    assert seal.load(path, HASH_A)[0].binary == b"after the counter was lost"


def test_an_old_counter_file_put_back_is_repaired(tmp_path, caplog):
    key = tmp_path / "keys" / "seal.key"
    seal = Seal(key)
    counter = tmp_path / "keys" / "seal.key.counter"
    seal.write(make(seal), tmp_path / "cache" / "a.sealed")
    old = counter.read_bytes()
    for _ in range(3):
        seal.write(make(seal), tmp_path / "cache" / "b.sealed")
    counter.write_bytes(old)  # genuine (MACed), but behind
    with caplog.at_level(logging.WARNING, logger="lib.security"):
        assert make(seal).counter == 5
    assert "holds 1 but the high-water index" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lib.security"):
        assert make(seal).counter == 6  # repaired: no warning again
    assert caplog.text == ""


# ---- folders writable by others, or not ours -------------------------------------


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777])
def test_a_loose_key_folder_is_refused(tmp_path, mode):
    key = tmp_path / "keys" / "seal.key"
    Seal(key)
    os.chmod(key.parent, mode)
    with pytest.raises(SealError) as err:
        Seal(key)
    message = str(err.value)
    assert message.startswith(f"key folder {key.parent} is writable by ")
    assert f"mode {mode:04o}" in message
    assert "\n" not in message


def test_a_loose_cache_folder_is_refused(seal, tmp_path, caplog):
    cache = _cache(tmp_path)
    key = cache_key(HASH_A, "template", None, "v1", **TARGET_80)
    cache.put(key, SOURCE, "ptx", TARGET_80["options"], "compute_80", "nvrtc 12.9")
    os.chmod(cache.folder, 0o775)
    loaded, verdict = cache.seal.load(cache.path(key), key)
    assert loaded is None and verdict.checks == ("seal.folder",)
    assert f"cache folder {cache.folder} is writable by group" in verdict.summary()
    with caplog.at_level(logging.WARNING, logger="lib.codegen"):
        assert cache.get(key)[1].checks == ("seal.folder",)
    assert cache.path(key).exists()  # not the entry's fault: left in place
    assert "left in place" in caplog.text
    with pytest.raises(SealError, match=f"{cache.folder} is writable by group"):
        cache.put(key, SOURCE, "ptx", TARGET_80["options"], "compute_80",
                  "nvrtc 12.9")
    with pytest.raises(SealError, match="writable by group"):
        _cache(tmp_path)
    os.chmod(cache.folder, 0o755)  # not writable by others: fine
    assert cache.get(key)[1].accepted


def test_a_folder_not_owned_by_this_user_is_refused(seal, tmp_path, monkeypatch):
    path = tmp_path / "cache" / "a.sealed"
    seal.write(make(seal), path)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(path).st_uid + 1)
    assert "not by this user" in folder_problem(path.parent)
    assert seal.load(path, HASH_A)[1].checks == ("seal.folder",)


def test_folders_the_seal_creates_are_0700_whatever_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        cache = _cache(tmp_path)
        key = cache_key(HASH_A, "template", None, "v1", **TARGET_80)
        cache.put(key, SOURCE, "ptx", TARGET_80["options"], "compute_80",
                  "nvrtc 12.9")
    finally:
        os.umask(old)
    for folder in (tmp_path / "keys", tmp_path / "kernels"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert cache.get(key, **TARGET_80)[1].accepted
