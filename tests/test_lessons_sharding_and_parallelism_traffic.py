"""Notebook 10 (reviews r13, r14, r15): the "At real scale" box says why 8 NICs cross over sooner,
DDP's ring rounds in default buckets and its tree steps, the AMD-host crossing (in the
derivation); the DDP rebuild aside is a footnote; DeepSpeed's ZeRO-3 reuse distance depends on
the model's size; the step-time table's header lines up with its rows and its growth is told in
rounds, an excess round said plainly; HSDP is named once."""

from __future__ import annotations

import pytest

from clusterlab import facts
from clusterlab.experiments import common
from clusterlab.lessons import sharding_and_parallelism_traffic as l10


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    monkeypatch.setattr(common, "load_per_core", lambda: 0.0)


def test_real_scale_names_amd_hosts_and_ddp_buckets(shown):
    assert l10.show_at_real_scale(7e9, units=32) == {"one": 625, "node": 240}
    text = " ".join(shown[0].split())
    assert "**240 ranks** (Intel or Arm hosts), 2.6× fewer" in text
    assert "cut the bytes term 8×, but the average ring step only 3.0×" in text
    # AMD hosts: an NVLink ring step is charged the tuner's 6 us net overhead, not 3.4 us
    assert "the 8-GPU crossing comes at about 160 ranks" in text
    assert text.index("160 ranks") > text.index("the derivation")
    assert "fill about 534, whose all-reduces take 2 · 534 · (N−1) ring steps, 11×" in text
    assert "if all are rings" in text
    # r15: no raw tree-vs-ring step counts (they mix NVLink and network steps); in the derivation
    assert "tree steps" not in text and text.index("fill about 534") > text.index("the derivation")
    assert "about 0.7 MB at 625 ranks" in text
    assert "[[" not in text
    # r16: the latency term grows below the crossing too; one GPU per node is rings forced, as
    # NCCL's default allows PAT there (tuning.cc, ncclPatEnable)
    assert "The latency term grows with every added rank either way" in text
    assert "stays flat as ranks are added" not in text
    assert "per node, rings forced (Ring only, set with NCCL_ALGO" in text
    assert "NCCL allows PAT (Parallel Aggregated Trees) in this layout" in text
    # r18: all-gathers and reduce-scatters do have a log-depth algorithm (PAT, NCCL >= 2.23),
    # on by default only with one GPU per node (tuning.cc, ncclPatEnable)
    assert "reduce-scatters have none" not in text
    assert "have PAT's log-depth schedule only with one GPU per node" in text
    assert "cheaper (at line rate)" in text
    algos = " ".join(l10.algorithms_and_overlap_text().split())
    assert "PAT's log-depth schedule for them is on by default only with one GPU per node" in algos
    # r20: the tuner's constants choose algorithms; they are not latency predictions (visible)
    visible = text[:text.index("<details>")]
    assert "not calibrated predictions of real latency" in visible
    # r21 UNSUPPORTED: DDP's rounds are named on the main path, with what sets FSDP apart
    assert "DDP in default buckets issues more calls still (11× FSDP's rounds)" in visible
    assert "FSDP's all-gathers must finish before the compute" in visible


def test_fsdp_collectives_across_nodes_need_infiniband_sharp(shown):
    """r20 FALSE: NVLink SHARP alone does not take FSDP's all-gathers and reduce-scatters off
    rings across nodes (NCCL 2.30.7 tuning.cc: NVLS needs CollNet when nNodes > 1, and
    AG/RS over NVLS or CollNetDirect need CollNet's iallgather/ireducescatter)."""
    facts.show(l10.algorithms_and_overlap_text())
    l10.show_at_real_scale(7e9, units=32)
    for text in (" ".join(t.split()) for t in shown):
        assert "NVLink SHARP or InfiniBand SHARP" not in text
        assert "unless the nodes have NVLink SHARP" not in text
    algos = " ".join(shown[0].split())
    # r21: the whole box is one fold with a one-line summary; CollNet in a nested fold
    assert algos.startswith("<details><summary>NCCL's algorithms and FSDP2's prefetch on GPUs")
    outer = algos[:algos.index("<details>", 1)]
    assert "stay rings by default" in outer and "CollNet" not in outer
    assert "avoid rings only with InfiniBand SHARP, alone (CollNetDirect) or combined" in algos
    assert "NVLS alone serves them only inside a node" in algos  # the ledger's value
    assert ("NVLS and CollNetDirect serve them across nodes only with CollNet (SHARP) enabled"
            in " ".join(shown[1].split()))


def test_amd_crossing_follows_from_the_ledger():
    c = l10.real_scale_constants()
    amd = facts.get("nccl.tuner_ring_intra_step_amd").value * 1e-6
    assert amd > c["a_nv"]
    assert l10.crossing(c["node"], c["node_nics"], units=32, a_net=c["a_net"], a_nv=amd,
                        psi=7e9, nic_bw=c["nic_bw"]) == 160


def _traffic():
    ddp = {"ops": 1, "by_kind": {"allreduce": 74880}, "sent": [74880] * 4, "predicted": 74880}
    zero1 = {"ops": 12, "by_kind": {}, "sent": [74880] * 4, "predicted": 74880}
    return {"ddp": ddp, "zero1": zero1, "zero2": dict(zero1),
            "zero3": {"ops": 9, "by_kind": {}, "sent": [112320] * 4, "predicted": 112320},
            "fsdp_no_reshard": {"ops": 6, "by_kind": {}, "sent": [74880] * 4,
                                "predicted": 74880}}


def test_deepspeed_zero3_keeps_the_last_units_by_reuse_distance():
    # 7B in 32 units of 219M: the i-th from the end waits 2 (i - 1) units, kept below 1e9
    assert l10.deepspeed_kept_units(7e9, 32) == 3
    assert l10.deepspeed_kept_units(0.5e9, 32) == 32  # a small model stays gathered whole
    assert l10.deepspeed_kept_units(1e9, 32) < 32


def test_traffic_footnotes_the_ddp_rebuild(shown):
    names = dict.fromkeys(("ddp", "zero1", "zero2", "zero3", "fsdp_no_reshard"), "")
    assert l10.explain_traffic(_traffic(), names) == 1.5
    head, footnote = shown[0].split("\n\n")[:2]
    assert "rebuil" not in head and head.startswith("Each rank sent **74880 B**")
    # r17: the footnote is a small fold of its own
    assert footnote.startswith("<details><summary>\\* Why step 3</summary>")
    assert "Step 2 also carries DDP's one-time bucket rebuild" in shown[0]
    assert "| `reduce_scatter=False` |" not in shown[0]
    assert "about the last 3: the i-th unit from the end" in shown[0]
    # r21 UNSUPPORTED: the arithmetic behind "the last 3" is shown
    assert "2(i − 1) × 0.22B parameters, and stays gathered while that is below 1B, so i ≤ 3. " \
        "That gives 2.91 (N−1)/N · Ψb" in shown[0]
    assert "under about 0.5B parameters stays gathered whole" in shown[0]
    assert "a little less" not in shown[0]
    # r20: why DeepSpeed's default is 1.5x: all-reduce (2) instead of reduce-scatter (1), + 1
    assert "2 + 1 = 3 (N−1)/N · Ψb against DDP's 2" in " ".join(shown[0].split())


def test_memory_table_and_working_set_crossing(capsys):
    assert l10.show_memory(7_000_000_000, ranks=64, units=32) == 86
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].split() == ["strategy", "state", "per", "GPU", "sent", "per", "step"]
    assert lines[2].split() == ["DDP", "112.0", "GB", "27.6", "GB"]
    assert lines[5].split() == ["ZeRO-3", "/", "FSDP", "1.8", "GB", "41.3", "GB"]
    flat = " ".join(out.split())
    assert "the next unit prefetched (gathered early, section Prefetching)" in flat
    assert "1.31 GB whatever N. From 86 GPUs on the working set is the larger" in flat


def test_microbatches_box_gives_fsdp2_reduce_dtype_default(shown):
    l10.show_microbatches()
    text = " ".join(shown[0].split())
    assert "by default `param_dtype` if set, otherwise the parameters' own dtype" in text
    assert text.index("<details>") > text.index("k× one micro-batch's bytes")


def test_step_time_header_lines_up_with_the_rows(capsys):
    def row(nic, ddp, fsdp, ddp_comm, fsdp_comm):
        return {"nic": nic, "ddp_s": ddp, "fsdp_s": fsdp, "ddp_comm_s": ddp_comm,
                "fsdp_comm_s": fsdp_comm, "ddp_predicted_s": ddp, "fsdp_predicted_s": fsdp,
                "ddp_sent": 100, "fsdp_sent": 150, "steps": 8}

    sweep = [row("delay 1ms", 0.010, 0.020, 0.004, 0.018),
             row("delay 5ms", 0.018, 0.056, 0.012, 0.054),
             row("delay 10ms", 0.028, 0.101, 0.022, 0.099),
             row("delay 1ms rate 50mbit", 0.042, 0.068, 0.036, 0.066)]
    l10.explain_step_times(sweep)
    verdict, header, ddp = capsys.readouterr().out.splitlines()[:3]
    assert verdict.startswith("Shown on this run:")  # the verdict first, then the table
    for label in ("delay 1ms -> 10ms", "50 Mbit/s cap adds"):
        assert label in header
    # each label ends where its column's "]" does
    ends = [i + 1 for i, ch in enumerate(ddp) if ch == "]"]
    assert header.index("10ms") + 4 == ends[0]
    assert header.index("adds") + 4 == ends[1]


def test_step_time_growth_in_rounds_and_an_excess_round_said(capsys):
    def row(nic, ddp, fsdp, ddp_comm, fsdp_comm):
        return {"nic": nic, "ddp_s": ddp, "fsdp_s": fsdp,
                "ddp_comm_s": ddp_comm, "fsdp_comm_s": fsdp_comm, "ddp_predicted_s": ddp,
                "fsdp_predicted_s": fsdp, "ddp_sent": 100, "fsdp_sent": 150, "steps": 7}

    # the r14 run: FSDP2 grew 90.3 ms against 81 (about one round of 9 ms more) from 1 to
    # 10 ms, but 36 ms, its 9 rounds of 4 ms, from 1 to 5 ms
    sweep = [row("delay 1ms", 0.0038, 0.0185, 0.002, 0.009),
             row("delay 5ms", 0.0118, 0.0545, 0.010, 0.045),
             row("delay 10ms", 0.0223, 0.1088, 0.020, 0.090),
             row("delay 1ms rate 50mbit", 0.0359, 0.0673, 0.0337, 0.0566)]
    assert l10.explain_step_times(sweep)
    out = " ".join(capsys.readouterr().out.split())
    assert "In rounds of 9.0 ms: DDP grew 2.1 (2 counted), FSDP2 grew 10.0 (9 counted)." in out
    assert ("FSDP2 grew about 1.0 round more than its 9, though the backend counts no other "
            "collective") in out
    assert ("to delay 5ms it grew 9.0 rounds of 4.0 ms, so the excess is no wait that every "
            "step pays. Not explained by this run") in out
    assert "DDP grew about" not in out and "the emulator against its own model" not in out
    sweep[1]["fsdp_s"] = 0.0585  # 10 rounds from 1 to 5 ms too: no such conclusion
    l10.explain_step_times(sweep)
    out = " ".join(capsys.readouterr().out.split())
    assert "it grew 10.0 rounds of 4.0 ms. Not explained" in out


def test_layout_names_hsdp_once(shown):
    l10.show_hybrid_sharding(7e9, nodes=16)
    text = " ".join(shown[0].split())
    assert "Hybrid sharding keeps the heavy traffic on NVLink" in text
    assert text.count("HSDP") == 1
    # r15: HSDP cuts the NIC bytes only 1.6x against plain FSDP's (8 NICs per node)
    # r17: the mechanism first, then a table: hybrid against plain FSDP over all 128 GPUs
    assert text.index("each rank only all-reduces its 1/8 shard") < text.index("| per rank")
    assert "| per rank and step | hybrid | plain FSDP over all 128 GPUs |" in text
    assert "| bytes through its NIC | 3.3 GB | 5.2 GB, only 1.6× more |" in text
    assert "| bytes over NVLink | 36.8 GB | 36.5 GB |" in text
    assert "| latency (tuner model, per step) | 16 ms | 57 ms |" in text
    # r16: both savings in ms at one NIC's 50 GB/s: 39 ms of bytes, 41 ms of latency
    assert ("saves 39 ms of NIC time and 41 ms of latency per step: a gain about as large as "
            "the bytes'") in text
    assert "The larger gain" not in text


def test_prefetch_saving_above_the_closed_form_is_explained(capsys):
    # r20: saved 44.8 of 40 ms; the prefetched forward's excess (12.6 ms) is below the
    # waiting one's (17.3 ms), so prefetching also hid 4.7 ms of uncharged overhead
    pre = {"forward_s": 0.1133, "forward_prefetch_s": 0.0686, "predicted_s": 0.096,
           "predicted_prefetch_s": 0.056, "depth": 6, "steps": 7}
    assert l10.explain_prefetch(pre) is True
    out = " ".join(capsys.readouterr().out.split())
    assert "112% of the closed form's 40.0 ms" in out
    assert ("It saved more than the closed form because prefetching also hid part of the "
            "overhead the closed form leaves out (below)") in out
    assert "with prefetching the excess fell by 4.7 ms, which is why the saving beat" in out
    assert "SMs" not in out  # the GPU mechanism is self-check 3's, with its source


def test_step_time_verdict_names_the_half_that_failed(capsys):
    # r25: a "Not shown" headline read as though the 2x had failed when only the 20% had
    def row(nic, ddp, fsdp, ddp_comm, fsdp_comm, spread):
        return {"nic": nic, "ddp_s": ddp, "fsdp_s": fsdp, "ddp_comm_s": ddp_comm,
                "fsdp_comm_s": fsdp_comm, "ddp_predicted_s": ddp, "fsdp_predicted_s": fsdp,
                "ddp_sent": 100, "fsdp_sent": 150, "steps": 7,
                "ddp_spread_s": spread, "fsdp_spread_s": spread}

    # FSDP2's cap added 60 ms against 48 (25% off, within the runs' scatter); it grew 81 ms
    # for latency, DDP 18
    sweep = [row("delay 1ms", 0.010, 0.020, 0.004, 0.018, 0.02),
             row("delay 5ms", 0.018, 0.056, 0.012, 0.054, 0.02),
             row("delay 10ms", 0.028, 0.101, 0.022, 0.099, 0.02),
             row("delay 1ms rate 50mbit", 0.042, 0.080, 0.036, 0.066, 0.02)]
    assert not l10.explain_step_times(sweep)
    verdict = capsys.readouterr().out.splitlines()[0]
    assert verdict.startswith("Not shown on this run: every growth within 20% of its closed "
                              "form (the farthest")
    assert "though FSDP2's step did grow over twice as much as DDP's" in verdict
