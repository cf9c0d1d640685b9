"""bench fabric: registered, JSON-shaped, and its measurements on real ranks behind a fabric
agree with the closed forms (one small incast and one rail layout; the bench runs the rest)."""

import json

import pytest

from clusterlab import bench as benches
from clusterlab import fabric_models as fm
from clusterlab.bench import fabric as bf
from clusterlab.experiments import fabric as ex


def test_the_bench_is_registered_and_its_rows_are_json():
    benches._load()
    assert "fabric" in benches.BENCHES
    row = bf._plain({"family": "incast", "model": fm.incast(2, 1024, rate_bps=1e9),
                     "arrivals": {(1, 0): [0.1]}, "messages": [(1, 0)]})
    text = json.dumps(row)
    assert '"1->0"' in text and json.loads(text)["model"]["senders"] == 2


@pytest.mark.timeout(120)
def test_incast_on_real_ranks_queues_at_the_receivers_port():
    rows = ex.incast((1, 3), nbytes=256 * 1024, nic="delay 1ms rate 100mbit", repeats=2)
    for r in rows:
        assert r["best"] >= 0.98 * r["model"].time_s  # the emulated network is never early
        assert r["best"] == pytest.approx(r["model"].time_s, rel=0.15)
    three = rows[1]
    assert three["queue"] == pytest.approx(three["model"].max_queue_s, rel=0.25)
    # one port shared by three senders (on a crossbar each would have its own NIC: ~1x)
    assert three["best"] > 2.2 * rows[0]["best"]


@pytest.mark.timeout(120)
def test_a_naive_rail_layout_crosses_the_oversubscribed_spine():
    rows = ex.rails(nbytes=1024 * 1024, repeats=1, dilation=2)
    aligned, naive = rows
    assert aligned["bottleneck"] != "uplink" and naive["bottleneck"] in ("uplink", "downlink")
    assert naive["best"] > 2 * aligned["best"]
    for r in rows:
        assert r["best"] == pytest.approx(r["model"], rel=0.25)


def test_bad_experiment_input_is_named_before_anything_starts():
    with pytest.raises(ValueError, match="counts"):
        ex.incast([0, 2])
    with pytest.raises(ValueError, match="no rate"):
        ex.rate_bps("delay 1ms")
    with pytest.raises(ValueError, match="flows"):
        ex.ecmp_hashing((40,), nodes_per_leaf=32)
    with pytest.raises(ValueError, match="oversubscription"):
        ex.rails(oversubscription=0, repeats=1)
