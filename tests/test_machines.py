"""Machine profiles: shipped profiles, provenance, errors that name the thing."""

from __future__ import annotations

import json
import os
from importlib import resources

import pytest

from lib.platform.machines import (
    GPU_CATALOG,
    MachineError,
    list_machines,
    load_machine,
    machine_from_json,
)


def test_shipped_profiles_exist():
    names = list_machines()
    for name in ("hetero-4", "uni-server-1gpu", "uni-server-2gpu-induced",
                 "local-cpu", "nvml"):
        assert name in names


def test_hetero4_is_genuinely_heterogeneous_with_mixed_topology(hetero4):
    assert hetero4.n == 4 and hetero4.simulated and not hetero4.induced
    assert len({d.name for d in hetero4.devices}) == 4
    kinds = {link.kind for link in hetero4.peers.values()}
    assert "nvlink" in kinds and any(k.startswith("pcie") for k in kinds)
    assert hetero4.peer(0, 3) is None and hetero4.peer(1, 0) is hetero4.peer(0, 1)
    # genuinely different cards: how much faster one is depends on the kernel
    h100, t4 = hetero4.devices[0], hetero4.devices[3]
    fp32_ratio = h100.peak_fp32 / t4.peak_fp32
    bw_ratio = h100.mem_bw / t4.mem_bw
    bf16_ratio = h100.peak_flops("bf16") / t4.peak_flops("bf16")
    assert abs(bw_ratio / fp32_ratio - 1) > 0.2 and bf16_ratio > 5 * fp32_ratio


def test_every_number_is_tagged(hetero4):
    rows = hetero4.provenance_table()
    assert rows and all(r["provenance"] in ("measured", "estimated") for r in rows)
    assert all(r["note"] for r in rows)


def test_induced_profile_scales_compute_and_memory_together():
    m = load_machine("uni-server-2gpu-induced")
    a, b = m.devices
    assert m.induced and a.name == b.name
    assert b.peak_fp32 / a.peak_fp32 == pytest.approx(b.mem_bw / a.mem_bw)
    assert b.peak_fp32 < a.peak_fp32
    assert "induced" in b.notes["peak_fp32"]


def test_one_gpu_profile():
    assert load_machine("uni-server-1gpu").n == 1


def test_local_cpu_is_real(local_cpu):
    assert not local_cpu.simulated and "cpu" in local_cpu.real_backends
    assert all(d.kind == "cpu" for d in local_cpu.devices)


def test_catalog_matches_datasheet_figures():
    assert GPU_CATALOG["H100 SXM"][0] == pytest.approx(66.9e12)
    assert GPU_CATALOG["T4"][3] == 0.0  # T4 has no BF16 tensor path
    assert GPU_CATALOG["A100 80GB SXM"][5] == pytest.approx(2039e9)


def test_unknown_machine_lists_known_ones():
    with pytest.raises(MachineError, match="unknown machine 'nope'.*hetero-4"):
        load_machine("nope")


def test_nvml_without_driver_says_why():
    try:
        load_machine("nvml")
    except MachineError as exc:
        assert str(exc).startswith("nvml:")


def test_malformed_profile_is_named():
    with pytest.raises(MachineError, match="profile broken"):
        machine_from_json({"name": "broken", "devices": [{"model": "x"}]})
    with pytest.raises(MachineError, match="peer 0-5: names a device"):
        machine_from_json({"name": "p", "devices": [{"catalog": "T4"}],
                           "peers": [{"a": 0, "b": 5, "kind": "nvlink"}]})


T4 = {"catalog": "T4"}
LINK = {"a": 0, "b": 1, "kind": "pcie3"}


@pytest.mark.parametrize("change, why", [
    ({"devices": [{"catalog": "T4", "scale": float("nan")}, T4]},
     "device 0 scale: expected a finite positive number, got nan"),
    ({"devices": [{"catalog": "T4", "scale": -1}, T4]}, "device 0 scale"),
    ({"devices": [{"catalog": "T4", "scale": 0}, T4]}, "device 0 scale"),
    ({"devices": [{"catalog": "T4", "scale": "0.5"}, T4]}, "device 0 scale"),
    ({"devices": [{"catalog": "T4", "scale": float("inf")}, T4]},
     "device 0 scale"),
    ({"host_mem_bw": float("nan")}, "host_mem_bw"),
    ({"peers": [{**LINK, "bandwidth": float("nan")}]}, "peer 0-1 bandwidth"),
    ({"peers": [{**LINK, "p2p": "false"}]}, "p2p must be true or false"),
    ({"peers": [{**LINK, "a": "0"}]}, "a must be a whole number"),
    ({"peers": [{**LINK, "b": 1.9}]}, "b must be a whole number"),
    ({"peers": [{**LINK, "a": 1}]}, "links device 1 to itself"),
    ({"peers": [LINK, {**LINK, "a": 1, "b": 0}]}, "linked twice"),
    ({"peers": [{**LINK, "latency": 1.0}]}, "unknown field 'latency'"),
    ({"typo_nccl": True}, "unknown field 'typo_nccl'"),
    ({"devices": [{"catalog": "T4", "mem_bytes": 1e6}, T4]},
     "device 0: unknown field 'mem_bytes'"),
    ({"devices": []}, "no devices"),
    ({"devices": {"catalog": "T4"}}, "devices must be a list"),
    ({"devices": ["T4", "L4"]}, "device 0: expected a JSON object"),
    ({"devices": [T4] * 65}, "65 devices, more than"),
    ({"devices": [{"catalog": "T5"}, T4]}, "device 0: unknown GPU model 'T5'"),
    ({"real_backends": "cuda"}, "real_backends must be a list"),
    ({"real_backends": ["gpu"]}, "real_backends names 'gpu'"),
    ({"nccl": "yes"}, "nccl must be true or false"),
    ({"name": 123}, "name must be a string"),
    ({"name": ".hidden"}, "name '.hidden' must be"),
])
def test_every_field_of_a_profile_is_checked(change, why):
    """A wrong type, a number that is not finite and positive, an unknown
    field or an impossible link is one error naming the field, not a
    machine that predicts NaN or negative times."""
    obj = {"name": "box", "devices": [T4, T4], "peers": [LINK], **change}
    with pytest.raises(MachineError) as err:
        machine_from_json(obj)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_a_valid_profile_keeps_what_it_states():
    box = machine_from_json({"name": "box", "devices": [
        {"catalog": "T4", "scale": 0.5}, {"catalog": "T4", "host_link": "pcie4"}],
        "peers": [{**LINK, "p2p": False, "bandwidth": 8e9}], "nccl": True,
        "real_backends": ["cuda"]})
    assert box.devices[0].peak_fp32 == pytest.approx(
        0.5 * box.devices[1].peak_fp32)
    assert box.host_links[1].kind == "pcie4"
    assert not box.peer(0, 1).p2p and box.peer(0, 1).bandwidth == 8e9
    assert box.nccl and box.real_backends == ("cuda",)


# ---- a profile of one's own, by path ---------------------------------------------

def test_a_profile_file_loads_by_path(tmp_path):
    shipped = resources.files("lib.platform").joinpath("profiles", "hetero-4.json")
    obj = json.loads(shipped.read_text())
    obj["name"] = "my-box"
    path = tmp_path / "my-box.json"
    path.write_text(json.dumps(obj))
    mine = load_machine(str(path))
    assert mine.name == "my-box"
    assert [d.name for d in mine.devices] == \
        [d.name for d in load_machine("hetero-4").devices]


@pytest.mark.parametrize("content, why", [
    (None, "cannot read it"),
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe{\x00}\x00", "not UTF-8"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"name": "x"}', ""),
])
def test_a_bad_profile_file_is_one_line_naming_it(tmp_path, content, why):
    path = tmp_path / "box.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(MachineError) as err:
        load_machine(str(path))
    assert str(path) in str(err.value) and why in str(err.value)
    assert "\n" not in str(err.value)


def test_a_profile_file_may_not_take_a_shipped_name(tmp_path):
    """Calibration and history are kept by name: a profile of one's own
    called ``hetero-4`` would read and write the shipped machine's."""
    path = tmp_path / "box.json"
    path.write_text(json.dumps({"name": "hetero-4", "devices": [T4]}))
    with pytest.raises(MachineError, match="'hetero-4' is a shipped profile's"):
        load_machine(str(path))


def test_a_profile_file_without_a_name_takes_its_stem(tmp_path):
    path = tmp_path / "rack-7.json"
    path.write_text(json.dumps({"devices": [T4]}))
    assert load_machine(str(path)).name == "rack-7"
    with pytest.raises(MachineError, match="no name"):
        machine_from_json({"devices": [T4]})


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "box.json"
    os.mkfifo(fifo)
    with pytest.raises(MachineError, match="not a regular file"):
        load_machine(str(fifo))


def test_the_last_level_cache_is_read_from_sysfs(tmp_path):
    from lib.platform.hostinfo import last_level_cache

    for name, level, kind, size in (("index0", 1, "Data", "48K"),
                                    ("index1", 1, "Instruction", "32K"),
                                    ("index2", 2, "Unified", "1024K"),
                                    ("index3", 3, "Unified", "32768K")):
        folder = tmp_path / name
        folder.mkdir()
        for field, value in (("level", level), ("type", kind), ("size", size),
                             ("shared_cpu_list", "0-1")):
            (folder / field).write_text(f"{value}\n")
    nbytes, where = last_level_cache(str(tmp_path))
    assert nbytes == 32 * 2**20
    assert "level 3" in where and "0-1" in where
    # no such folder, or an unreadable size: the term is off, saying why
    assert last_level_cache(str(tmp_path / "absent"))[0] == 0.0
    (tmp_path / "index3" / "size").write_text("lots\n")
    assert last_level_cache(str(tmp_path))[0] == 2**20   # the L2 is left


def test_a_profile_of_ones_own_is_found_by_its_name_through_the_environment(
        tmp_path, monkeypatch):
    from lib.platform.machines import PROFILES_ENV

    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"name": "my-box",
                                "devices": [{"catalog": "T4"}, {"catalog": "A10"}]}))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"name": "their-box", "devices": [{"catalog": "T4"}]}))
    with pytest.raises(MachineError, match="unknown machine 'my-box'"):
        load_machine("my-box")
    monkeypatch.setenv(PROFILES_ENV, os.pathsep.join([str(other), str(mine)]))
    m = load_machine("my-box")
    assert m.name == "my-box" and m.n == 2
    assert load_machine("their-box").n == 1
    assert load_machine("hetero-4").name == "hetero-4"  # shipped names first
    with pytest.raises(MachineError, match="unknown machine 'nope'"):
        load_machine("nope")
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    monkeypatch.setenv(PROFILES_ENV, str(broken))
    with pytest.raises(MachineError, match="broken.json"):
        load_machine("my-box")


def test_the_summary_of_dask_workers_fits_a_book_page():
    """A Dask worker's label is its address: it takes a line of its own, so no
    line passes the book's width (the HTML check refused m08's page of a
    ``dask-local:2`` book: 112 characters)."""
    import dataclasses

    from lib.book import MAX_OUTPUT_CHARS

    box = load_machine("local-cpu")
    workers = dataclasses.replace(box, devices=tuple(
        dataclasses.replace(d, name=f"dask worker tcp://127.0.0.1:{39119 + d.index}")
        for d in box.devices))
    lines = workers.summary().splitlines()
    assert max(map(len, lines)) <= MAX_OUTPUT_CHARS, lines
    assert lines[1] == "  0:dask worker tcp://127.0.0.1:39119"
    assert lines[2].split()[0] == "fp32" and lines[2].startswith(" " * 25)
    short = load_machine("hetero-4").summary().splitlines()
    assert short[1].startswith("  0:H100 SXM") and "fp32" in short[1]
