"""Machine profiles: shipped profiles, provenance, errors that name the thing."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import pytest

from lib.contract import TaskSpec
from lib.platform.machines import (
    GPU_CATALOG,
    MachineError,
    catalog_model,
    list_machines,
    load_machine,
    machine_from_json,
    nvml_machine,
)
from lib.platform.telemetry import RecordedNvml


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


DATA = Path(__file__).parent / "data"


def _recording(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_the_live_machine_has_the_nvlink_nvml_counts():
    """Two A100s joined by three NVLink bridges (12 active links each side)
    are peers at 12 x 25 GB/s per direction, the card's NVLink rate; memory
    is what NVML reads, the rest the datasheet's."""
    box = nvml_machine(RecordedNvml(_recording("nvml_snapshot.json")))
    assert [d.name for d in box.devices] == ["A100 80GB SXM"] * 2
    assert box.devices[0].mem_bytes == 85899345920
    assert box.devices[0].provenance["mem_bytes"] == "measured"
    assert box.devices[0].peak_fp32 == GPU_CATALOG["A100 80GB SXM"][0]
    link = box.peer(0, 1)
    assert link.kind == "nvlink" and link.p2p and link.bandwidth == 300e9
    assert "12 active NVLink" in link.note


def test_fewer_nvlinks_are_a_slower_peer_link():
    record = _recording("nvml_snapshot.json")
    for dev in record["devices"]:
        for lane in range(4, 12):
            dev["nvlink"][str(lane)]["state"] = 0
    link = nvml_machine(RecordedNvml(record)).peer(0, 1)
    assert link.bandwidth == 4 * 25e9 and "4 active NVLink" in link.note


def test_cards_the_catalog_lacks_are_read_from_nvml():
    """An L40S (not in the catalog) is described by what NVML reports: FP32
    from its cores and highest SM clock, bandwidth from its memory bus and
    clock, each figure marked an estimate with how it was made. Two cards
    behind one switch whose peer-to-peer reads work are peers; a card on
    the other socket is reached through the host."""
    box = nvml_machine(RecordedNvml(_recording("nvml_unknown_cards.json")))
    l40s, _, rtx = box.devices
    assert l40s.name == "L40S" and rtx.name == "RTX 4090"
    assert l40s.peak_fp32 == pytest.approx(18176 * 2 * 2520e6)
    assert l40s.mem_bw == pytest.approx(384 / 8 * 9001e6 * 2)
    assert l40s.peak_fp64 == pytest.approx(l40s.peak_fp32 / 64)
    # FP32 x the L4's tensor ratio (both compute capability 8.9): within 2 %
    # of the 362 TFLOP/s dense FP16 of NVIDIA's L40S datasheet
    assert l40s.tensor_fp16 == pytest.approx(
        l40s.peak_fp32 * GPU_CATALOG["L4"][2] / GPU_CATALOG["L4"][0])
    assert l40s.tensor_fp16 == pytest.approx(362e12, rel=0.02)
    assert l40s.tensor_bf16 == l40s.tensor_fp16
    assert "ratio of the L4 (compute capability 8.9)" in l40s.notes["tensor_fp16"]
    assert l40s.provenance["peak_fp32"] == "estimated"
    assert "18176 CUDA cores" in l40s.notes["peak_fp32"]
    assert "compute capability 8.9" in l40s.notes["peak_fp64"]
    assert box.host_link(0).kind == "pcie4"
    assert rtx.peak_fp32 == GPU_CATALOG["RTX 4090"][0]
    assert box.peer(0, 1).p2p and box.peer(0, 1).kind == "pcie4"
    assert box.peer(0, 2) is None and box.peer(1, 2) is None


@pytest.mark.parametrize("name, cores, sm_mhz, capability, fp16, bf16, like", [
    # NVIDIA's Ada whitepaper: 97.5 TFLOP/s dense FP16 with FP32 accumulate,
    # half the rate of a workstation card of its architecture
    ("NVIDIA GeForce RTX 4080", 9728, 2505, [8, 9], 97.5e12, 97.5e12, "RTX 4090"),
    # Quadro RTX 6000 (Turing): 130.5 TFLOP/s FP16 tensor, no BF16 path
    ("Quadro RTX 6000", 4608, 1770, [7, 5], 130.5e12, 0.0, "T4"),
    # an architecture the catalog has no card of: no tensor path assumed
    ("NVIDIA B300", 20480, 2000, [10, 3], 0.0, 0.0, None),
])
def test_an_unknown_cards_tensor_rates_follow_a_catalog_card_of_its_architecture(
        name, cores, sm_mhz, capability, fp16, bf16, like):
    record = _recording("nvml_unknown_cards.json")
    card = record["devices"][0]
    card.update(name=name, cores=cores, compute_capability=capability,
                max_clocks={**card["max_clocks"], "sm": sm_mhz})
    dev = nvml_machine(RecordedNvml(record)).devices[0]
    assert dev.tensor_fp16 == pytest.approx(fp16, rel=0.02, abs=1.0)
    assert dev.tensor_bf16 == pytest.approx(bf16, rel=0.02, abs=1.0)
    assert dev.provenance["tensor_fp16"] == "estimated"
    note = dev.notes["tensor_bf16"]
    assert (f"of the {like}" in note or f"as on the {like}" in note) if like \
        else "no catalog card" in note and "no tensor path assumed" in note


def test_peer_reads_refused_by_nvml_leave_two_cards_without_a_peer_link():
    record = _recording("nvml_unknown_cards.json")
    record["p2p_read"] = [[False] * 3 for _ in range(3)]
    assert nvml_machine(RecordedNvml(record)).peer(0, 1) is None
    del record["p2p_read"]   # no status: one switch is taken to allow it
    assert nvml_machine(RecordedNvml(record)).peer(0, 1).p2p
    record["topology"][0][1] = record["topology"][1][0] = 40   # host bridge
    assert nvml_machine(RecordedNvml(record)).peer(0, 1) is None


def test_a_card_nvml_cannot_describe_is_one_line_naming_it():
    record = _recording("nvml_unknown_cards.json")
    del record["devices"][1]["cores"]
    with pytest.raises(MachineError) as err:
        nvml_machine(RecordedNvml(record))
    text = str(err.value)
    assert text.startswith("nvml: GPU 1 ('NVIDIA L40S') is not in the catalog")
    assert "profile of your own" in text and "\n" not in text


def test_a_gpu_nvml_cannot_read_is_one_line_naming_it():
    record = _recording("nvml_snapshot.json")
    record["devices"][1]["memory"] = {"error": "GPU is lost"}
    with pytest.raises(MachineError, match=r"^nvml: GPU 1: NVML cannot read it "
                       r"\(GPU is lost\)$"):
        nvml_machine(RecordedNvml(record))


@pytest.mark.parametrize(("name", "model"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"), ("Tesla V100-SXM2-32GB",
                                                   "V100 SXM2 32GB"),
    ("Tesla T4", "T4"), ("NVIDIA L4", "L4"), ("NVIDIA A10", "A10"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA L40S", None), ("NVIDIA L40", None), ("NVIDIA A10G", None),
    ("NVIDIA GH200 480GB", None), ("NVIDIA RTX A4000", None)])
def test_nvml_names_map_onto_the_catalog_by_whole_words(name, model):
    assert catalog_model(name) == model


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
    ({"peers": [{**LINK, "latency": -1.0}]}, "peer 0-1 latency"),
    ({"peers": [{**LINK, "speed": 1.0}]}, "unknown field 'speed'"),
    ({"typo_nccl": True}, "unknown field 'typo_nccl'"),
    ({"devices": [{"catalog": "T4", "memory": 1e6}, T4]},
     "device 0: unknown field 'memory'"),
    ({"devices": [{"name": "X1", "peak_fp32": 1e13, "mem_bytes": 1e10}, T4]},
     "device 0: no catalog and no mem_bw"),
    ({"devices": [{"peak_fp32": 1e13, "mem_bytes": 1e10, "mem_bw": 1e11}]},
     "device 0: no catalog and no name"),
    ({"devices": [{"catalog": "T4", "name": " "}, T4]}, "name must not be empty"),
    ({"devices": [{"catalog": "T4", "mem_bw": {"value": 3e11,
                                              "provenance": "guessed"}}, T4]},
     "device 0 mem_bw: provenance 'guessed'"),
    ({"devices": [{"catalog": "T4", "mem_bw": {"provenance": "measured"}}, T4]},
     "device 0 mem_bw: no value"),
    ({"devices": [{"catalog": "T4", "mem_bw": {"value": 3e11, "src": "x"}}, T4]},
     "device 0 mem_bw: unknown field 'src'"),
    ({"devices": [{"catalog": "T4", "tensor_fp16": -1}, T4]},
     "device 0 tensor_fp16: expected a finite number >= 0"),
    ({"devices": [{"catalog": "T4", "peak_fp32": 0}, T4]},
     "device 0 peak_fp32: expected a finite positive number"),
    ({"devices": [{"catalog": "T4", "mem_bytes": float("inf")}, T4]},
     "device 0 mem_bytes"),
    ({"devices": [{"catalog": "T4", "max_block": 32}, T4]}, "max_block 32"),
    ({"devices": [{"catalog": "T4", "max_block": 2048}, T4]}, "max_block 2048"),
    ({"devices": [{"catalog": "T4", "max_block": 256.0}, T4]},
     "max_block must be a whole number"),
    ({"devices": [{"catalog": "T4", "host_link": {"kind": "pcie9"}}, T4]},
     "device 0 host_link: unknown link kind 'pcie9'"),
    ({"devices": [{"catalog": "T4", "host_link": {"bandwidth": 1e9}}, T4]},
     "device 0 host_link: no 'kind'"),
    ({"devices": [{"catalog": "T4", "host_link": {"kind": "pcie4",
                                                  "latency": 0}}, T4]},
     "device 0 host_link latency"),
    ({"devices": []}, "no devices"),
    ({"devices": {"catalog": "T4"}}, "devices must be a list"),
    ({"devices": ["T4", "L4"]}, "device 0: expected a JSON object"),
    ({"devices": [T4] * 65}, "65 devices, more than"),
    ({"devices": [{"catalog": "T5"}, T4]}, "device 0: unknown GPU model 'T5'. "),
    ({"devices": [{"catalog": "h100 sxm"}, T4]}, "did you mean 'H100 SXM'?"),
    ({"devices": [{"catalog": "A100"}, T4]},
     "did you mean 'A100 40GB PCIe' or 'A100 80GB SXM'?"),
    ({"devices": [{"catalog": "NVIDIA Tesla T4"}, T4]}, "did you mean 'T4'?"),
    # a close spelling is another card: no guess, the figures are the way
    ({"devices": [{"catalog": "L40S"}, T4]}, "'L40S'. The catalog has"),
    ({"devices": [{"catalog": "RTX 4080"}, T4]}, "described by its figures"),
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


def test_a_card_the_catalog_lacks_is_described_by_its_figures():
    """A card the catalog lacks is stated by its figures, each a number (an
    estimate) or a value with its provenance; what is not stated is assumed
    and says so, and the provenance table keeps measured and estimated
    apart."""
    box = machine_from_json({"name": "box", "devices": [
        {"name": "L40S", "peak_fp32": 91.6e12, "tensor_fp16": 362e12,
         "mem_bytes": 48e9,
         "mem_bw": {"value": 7.9e11, "provenance": "measured",
                    "note": "STREAM triad on the card"},
         "host_link": {"kind": "pcie4", "bandwidth": {"value": 2.4e10,
                                                      "provenance": "measured"},
                       "latency": 9e-6},
         "max_block": 512, "cache_bytes": 96e6},
        {"catalog": "T4"}],
        "peers": [{**LINK, "latency": 4e-6}]})
    card = box.devices[0]
    assert (card.name, card.peak_fp32, card.tensor_fp16, card.mem_bw) == \
        ("L40S", 91.6e12, 362e12, 7.9e11)
    assert card.tensor_bf16 == 0.0 and "no tensor path" in card.notes["tensor_bf16"]
    assert card.peak_fp64 == pytest.approx(91.6e12 / 64)
    assert card.provenance["mem_bw"] == "measured"
    assert card.provenance["peak_fp32"] == "estimated"
    assert card.notes["mem_bw"] == "STREAM triad on the card"
    assert (card.max_block, card.cache_bytes) == (512, 96e6)
    host = box.host_link(0)
    assert (host.kind, host.bandwidth, host.latency) == ("pcie4", 2.4e10, 9e-6)
    assert host.provenance == "measured"   # the bandwidth's
    assert box.peer(0, 1).latency == 4e-6
    rows = {r["what"]: r for r in box.provenance_table()}
    assert rows["device 0:L40S mem_bw"]["provenance"] == "measured"
    assert rows["device 0:L40S peak_fp32"]["provenance"] == "estimated"


def test_a_catalog_card_takes_the_figures_its_profile_states():
    """A stated figure replaces the datasheet's; a scale (an induced
    slow-down) then applies to it as to the rest."""
    box = machine_from_json({"name": "box", "devices": [
        {"catalog": "A100 80GB SXM", "mem_bw": {"value": 1.7e12,
                                                "provenance": "measured"},
         "scale": 0.5},
        {"catalog": "A100 80GB SXM"}]})
    fast, slow = box.devices[1], box.devices[0]
    assert slow.name == fast.name == "A100 80GB SXM"
    assert slow.mem_bw == pytest.approx(0.5 * 1.7e12)
    assert slow.peak_fp32 == pytest.approx(0.5 * fast.peak_fp32)
    assert slow.provenance["mem_bw"] == "measured"
    assert fast.provenance["mem_bw"] == "estimated"
    assert slow.mem_bytes == fast.mem_bytes


def test_a_card_described_by_its_figures_is_decided_for():
    """The policy and the optimum decide for a card they never met in
    training, and a faster card stated by its figures gets the larger
    share of a large matmul."""
    from lib.policies.oracle import optimum
    from lib.runtime import Agent

    box = machine_from_json({"name": "figures-box", "devices": [
        {"name": "future card", "peak_fp32": 120e12, "tensor_fp16": 1.2e15,
         "tensor_bf16": 1.2e15, "mem_bytes": 96e9, "mem_bw": 4e12,
         "host_link": "pcie5"},
        {"catalog": "T4"}]})
    task = TaskSpec(kind="matmul", dims={"M": 8192, "N": 8192, "K": 8192},
                    dtype="fp32")
    decision = Agent(machine=box).optimize(task)
    shares = dict(zip(decision.gpus, decision.shares, strict=True))
    assert shares.get(0, 0.0) > shares.get(1, 0.0)
    best = optimum(task, box)
    assert dict(zip(best.decision.gpus, best.decision.shares,
                    strict=True)).get(0, 0.0) > 0.5


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


def test_the_reference_chapters_profiles_load():
    """The profiles the reference chapter shows are ones a reader can copy."""
    import re

    text = (Path(__file__).parents[1] / "book" / "reference.md").read_text()
    section = text[text.index("## A machine profile"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] \
        else section
    blocks = re.findall(r"```json\n(.*?)```", section, re.S)
    assert len(blocks) >= 2
    machines = [machine_from_json(json.loads(b)) for b in blocks]
    assert any(d.provenance.get("mem_bw") == "measured"
               for m in machines for d in m.devices)


def test_heterogeneous_is_what_devices_can_do_not_their_names():
    assert load_machine("hetero-4").heterogeneous
    # two A100s of one name, one clock-locked to 60 %: heterogeneous
    assert load_machine("uni-server-2gpu-induced").heterogeneous
    assert not load_machine("uni-server-1gpu").heterogeneous
    twins = {"name": "twins", "devices": [{"catalog": "L4"}, {"catalog": "L4"}]}
    assert not machine_from_json(twins).heterogeneous
    # the same cards, one behind a network link to the host
    far = {"name": "far", "devices": [{"catalog": "L4", "host_link": "network"},
                                      {"catalog": "L4"}]}
    assert machine_from_json(far).heterogeneous
    # peer links join pairs: an NVLink pair among four alike stays homogeneous
    pair = {**twins, "devices": [{"catalog": "L4"}] * 4,
            "peers": [{"a": 0, "b": 1, "kind": "nvlink", "p2p": True}]}
    assert not machine_from_json(pair).heterogeneous
