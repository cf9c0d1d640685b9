"""Notebook 10b (review r20): the pipeline result as a sentence and a table in hops, the
replay's ms in the appendix; the production-size boxes (TP bytes, 1F1B's round trip and which
implementation it models, node-limited routing); the capacity factor attributed to Switch."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab import facts
from clusterlab.experiments import common
from clusterlab.lessons import tensor_pipeline_expert_parallelism as l10b

CALM, ROUGH = "delay 100us", "delay 10ms 5ms"


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    monkeypatch.setattr(common, "load_per_core", lambda: 0.0)


def _pipe_rows():
    return [{"nic": nic, "schedule": schedule, "steps_kept_of": 7, "activation_bytes": 10,
             "p2p_sent": [80, 160, 160, 80], "bubble": 0.29, "bubble_formula": 0.27,
             "simulated_bubble": 0.27, "step_s": 0.52, "simulated_step_s": 0.508,
             "ideal_step_s": 0.495}
            for nic in (CALM, ROUGH) for schedule in ("gpipe", "1f1b")]


def test_pipeline_growth_in_hops_as_a_sentence_with_the_table_in_the_appendix(monkeypatch,
                                                                              capsys):
    growth = {"gpipe": {"measured": np.array([0.069, 0.0798, 0.083]),
                        "replay": np.array([0.069, 0.086])},
              "1f1b": {"measured": np.array([0.140, 0.1605, 0.182]),
                       "replay": np.array([0.146, 0.193])}}
    monkeypatch.setattr(l10b.exp, "pipeline_growth", lambda pipe, calm, rough: growth)
    monkeypatch.setattr(l10b, "replay_split", lambda pipe, calm, rough: {
        "gpipe": {"delay": 0.0594, "drift": -0.0013}, "1f1b": {"delay": 0.1584, "drift": 0.004}})
    details: list[str] = []
    assert l10b.explain_pipeline(_pipe_rows(), calm=CALM, rough=ROUGH, details=details)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Shown on this run: 1F1B lost more time")
    assert lines[1] == ("On the rough network the step grew by 79.8 ms (GPipe) and 160.5 ms "
                        "(1F1B), medians of 7 steps: 1F1B paid more.")
    # r21: one sentence on the main path, the table (with the prediction) in the appendix
    assert lines[2] == ("In hops of 9.9 ms (the rough network's delay minus the calm one's): "
                        "GPipe's step grew by about 8 hops' worth (delay and jitter), 1F1B's "
                        "by about 16: 1F1B waits mid-step too, GPipe only while the pipeline "
                        "fills and drains (the "
                        "prediction and a jitter-free replay: appendix).")
    assert lines[3].startswith("Bubble on the calm network")
    assert "59.4 ms" not in "\n".join(lines) and "fill/drain" not in "\n".join(lines)
    table = details[0].splitlines()
    assert table[0].startswith("PP, the growth in hops")
    assert "replay: a simulator re-running this run's schedule without jitter" in table[0]
    assert table[1].split() == ["hops", "of", "9.9", "ms", "predicted", "replay,", "delay",
                                "alone", "measured"]
    assert table[2].split() == ["GPipe", "6", "6", "8"]
    assert table[3].split() == ["1F1B", "12", "+", "fill/drain", "16", "16"]
    assert details[1].startswith("PP: by the replay")
    assert "the replay adds the fill and drain" in details[1]


def test_production_size_boxes(capsys, shown):
    tp = l10b.tp_at_production_size(hidden=8192, seq=4096, layers=80, t=8)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("Over NICs TP's all-reduces alone would take 3.8x the "
                                   "compute floor: tensor parallelism stays inside the NVLink "
                                   "domain.")
    assert "8% more, are left out" in out  # folded (printed as it is outside a notebook)
    l10b.pp_wait_at_production_size(tp, stages=8)
    text = " ".join(shown[0].split())
    visible = text[:text.index("<details>")]
    assert "the wait is about 9% of the compute (1% with sequence parallelism)" in visible
    # r20 UNSUPPORTED 1: which implementation the round-trip model fits, Megatron's not
    assert ("Megatron-Core overlaps these transfers with compute only in the interleaved "
            "schedule") in visible
    # r20 UNSUPPORTED 2: a hop's microseconds cited from the ledger
    assert "NCCL's tuner charges one network step of a ring 14 µs<sup>" in text
    assert "not a calibrated latency" in text  # r21: the tuner constant's caveat
    assert "| 1F1B's wait, 1.75 hops (p = 8) | 2.35 ms | 0.29 ms |" in text
    moe = l10b.moe_at_production_size(seq=4096, nic=tp["nic"])
    assert moe["dispatch"] == pytest.approx(4096 * 8 * 7168 * (1 + 4 / 128))
    moe_text = " ".join(shown[-1].split())
    # r21: the visible size is the forward dispatch; the H800's NVLink carries its citation
    assert "DeepSeek caps it at 4 nodes<sup>" in moe_text
    assert "The forward dispatch then sends at most 121 MB per GPU and layer" in moe_text
    assert "the backward pass repeats both" in moe_text and "160 GB/s<sup>" in moe_text


def test_capacity_factor_is_switch_transformers():
    text = " ".join(facts.render(l10b.real_cluster_text(one_nv=0.001, hot_share=0.75,
                                                         capacity_factor=1.25)).split())
    assert "The Switch Transformer sets expert capacity = capacity factor" in text
    assert "GShard similarly caps each expert's load" in text
    assert "GShard and the Switch Transformer set" not in text
