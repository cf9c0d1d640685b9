"""The explorers, headless: their callbacks draw with Agg, the numbers they show are the ones
sim/models/link compute, sliders are debounced, real runs overlay points and leave no
process behind, and without a front-end `.show()` returns a static Figure."""

from __future__ import annotations

import statistics
import time

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from conftest import live_children  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from clusterlab import models  # noqa: E402
from clusterlab.link import LinkModel, delay_values_ns  # noqa: E402
from clusterlab.netem import Netem  # noqa: E402
from clusterlab.schedule import Collective, QueueState, play  # noqa: E402
from clusterlab.sim import simulate_training  # noqa: E402
from clusterlab.step_model import (  # noqa: E402
    NODE_COUNTS,
    STEP_MODEL_ALGORITHMS,
    TrainingSetup,
    predict_step,
    predicted_curve,
)
from clusterlab.topology import Topology  # noqa: E402
from clusterlab.widgets import (  # noqa: E402
    LinkExplorer,
    RingStepper,
    ThroughputExplorer,
    frontend_available,
    netem_string,
)
from clusterlab.widgets._common import Debouncer  # noqa: E402
from clusterlab.widgets.background_sim import BackgroundSimulator  # noqa: E402
from clusterlab.widgets.link_delays import configured_law_ns  # noqa: E402
from clusterlab.widgets.ring import chunk_counts, ring_timeline  # noqa: E402
from clusterlab.wire import HEADER_BYTES  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftovers")]

US, MS = 1_000, 1_000_000


def quiet(explorer):
    """Drop the debounced update that setting controls scheduled: the test calls update()."""
    explorer.debouncer.cancel()
    return explorer


def labels(ax) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.texts] if legend is not None else []


# --- the netem string ---------------------------------------------------------------------


def test_netem_string_is_real_netem_syntax():
    text = netem_string(20, 5, "normal", 100, 0.1)
    assert text == "delay 20us 5us distribution normal rate 100gbit loss 0.1%"
    spec = Netem.parse(text)
    assert (spec.delay_ns, spec.jitter_ns, spec.rate_bps) == (20_000, 5_000, 100 * 10**9)
    assert netem_string(2000, 0, "pareto", 0.1, 0) == "delay 2ms rate 100mbit"  # zeros left out
    assert netem_string(0, 0, "uniform", 0, 0) == ""
    assert netem_string(100, 10, "uniform") == "delay 100us 10us"  # netem's default law


# --- the throughput explorer ---------------------------------------------------------------


def test_throughput_explorer_draws_what_models_and_sim_compute():
    ex = quiet(ThroughputExplorer(nodes=64, jitter_us=20))
    ex.set(nodes=32, latency_us=50)
    quiet(ex).update()
    assert ex.last_error is None
    setup = ex.setup
    assert setup.nodes == 32 and setup.nic == "delay 50us 20us distribution normal rate 100gbit"
    assert "delay 50us 20us distribution normal rate 100gbit" in ex.nic_label.value
    axes = ex._axes
    assert axes["efficiency"].get_xlabel() == "nodes"
    assert axes["throughput"].get_ylabel() == "samples / s"
    assert axes["efficiency"].get_title() == "scaling efficiency"
    assert ex.controls["algorithm"].options == STEP_MODEL_ALGORITHMS  # each has a closed form
    assert labels(axes["efficiency"]) == []  # the throughput legend explains both
    # The curve is the closed form at N = 1 .. 1024.
    curve = predicted_curve(setup)
    xs, ys = axes["throughput"].lines[1].get_data()
    assert list(xs) == list(NODE_COUNTS)
    np.testing.assert_allclose(ys, [c.throughput for c in curve], rtol=1e-12)
    assert curve[5].throughput == pytest.approx(predict_step(setup).throughput)
    # The simulated point and histogram are simulate_training's, recomputed here.
    assert ex.sim_state == "done"
    sim = simulate_training(**ex.sim_kwargs)
    assert ex.sim_kwargs["nodes"] == 32 and ex.sim_kwargs["steps"] >= 5
    np.testing.assert_array_equal(sim.step_times, ex.sim.step_times)
    assert list(ex._axes["sim_thr"].get_data()[1]) == [sim.throughput]
    assert ex._axes["p50"].get_xdata()[0] == pytest.approx(sim.percentile(50) * 1e3)
    # a few simulated steps cannot estimate a p99: the dashed line is the slowest step
    assert len(sim.step_times) < 100
    assert ex._axes["tail"].get_xdata()[0] == pytest.approx(sim.step_times.max() * 1e3)
    assert (f"slowest of {len(sim.step_times)} (dashed) {sim.step_times.max() * 1e3:.4g} ms"
            in axes["hist"].get_title())
    assert "p99" not in axes["hist"].get_title() and "p99" not in ex.summary.value
    assert f"{sim.throughput:,.0f} samples/s" in ex.summary.value
    assert f"{predict_step(setup).throughput:,.0f} samples/s" in ex.summary.value
    # Breakdown: compute + exposed communication, closed form and simulated.
    comp, comm = ex._axes["comp_bars"], ex._axes["comm_bars"]
    assert comp[0].get_width() == pytest.approx(100.0)
    assert comm[0].get_width() == pytest.approx(predict_step(setup).exposed_s * 1e3)
    assert comm[1].get_width() == pytest.approx(sim.exposed_comm * 1e3)
    assert ex.png.startswith(b"\x89PNG")
    assert ex.out.outputs[0]["data"]["image/png"]
    ex.close()


def test_slider_bursts_are_debounced_into_one_update():
    calls = []
    d = Debouncer(lambda: calls.append(time.monotonic()), delay_s=0.1)
    for _ in range(25):
        d.trigger()
    assert d.wait(5)
    assert len(calls) == 1 and d.runs == 1

    ex = ThroughputExplorer(debounce_s=0.1)
    for n in (2, 4, 8, 16, 32, 64):  # a drag across six stops
        ex.controls["nodes"].value = n
    ex.controls["latency_us"].value = 100
    assert ex.debouncer.wait(30)
    assert ex.debouncer.runs == 1
    assert ex.prediction.nodes == 64 and ex.last_error is None
    ex.close()


def test_update_at_256_nodes_is_fast():
    ex = quiet(ThroughputExplorer(nodes=256))
    ex.update()  # warm-up: numba's cache, font cache, first sim
    times = []
    for latency in (20, 50, 20, 50, 20):  # a new setup each time: nothing comes from a cache
        ex.controls["latency_us"].value = latency
        ex.controls["jitter_us"].value = 5 if latency == 20 else 10
        quiet(ex).update()
        times.append(ex.last_update_s)
    median = statistics.median(times)
    print(f"\nThroughputExplorer.update() at N=256: median {median * 1e3:.0f} ms, "
          f"all {[round(t * 1e3) for t in times]} ms")
    assert ex.last_error is None and ex.wait_for_simulation(30) and ex.sim_state == "done"
    assert median < 1.0  # the target is 200 ms; this machine is shared and noisy
    ex.close()


def test_slow_simulations_run_in_the_background():
    ex = quiet(ThroughputExplorer(nodes=256, algorithm="recursive_doubling", model_mib=25))
    ex.update()
    assert ex.last_update_s < 1.5
    assert ex.sim_state == "pending" and "simulating" in ex.sim_note
    assert ex.wait_for_simulation(60)
    assert ex.sim_state == "done" and ex.sim is not None
    sim = simulate_training(**ex.sim_kwargs)
    np.testing.assert_array_equal(sim.step_times, ex.sim.step_times)
    ex.close()


def test_background_simulations_are_replaced_not_queued():
    background = BackgroundSimulator()
    got = []
    slow = TrainingSetup(nodes=256, algorithm="recursive_doubling", model_mib=250).sim_kwargs(10)
    fast = TrainingSetup(nodes=8).sim_kwargs(3)
    background.submit(slow, lambda res, err, s: got.append(("slow", res, err)))
    time.sleep(0.3)
    background.submit(fast, lambda res, err, s: got.append(("fast", res, err)))  # kills slow
    assert background.wait(30)
    assert [g[0] for g in got] == ["fast"] and got[0][2] is None
    np.testing.assert_array_equal(got[0][1].step_times, simulate_training(**fast).step_times)


def test_run_for_real_overlays_measured_points():
    ex = quiet(ThroughputExplorer(nodes=2, model_mib=1, compute_ms=20, real_steps=3))
    ex.update()
    t0 = time.monotonic()
    ex.on_run_clicked(None)
    assert ex.runner.join(20), "the real run did not finish in 20 s"
    assert time.monotonic() - t0 < 20
    m = ex.measured
    assert m is not None, ex.status.value
    assert m.plan.setup.nodes == 2 and len(m.step_times) == 3 and ex.progress.value == 3
    assert (m.step_times >= 0.02).all()  # each step sleeps its 20 ms of compute
    # The simulated point includes this machine's plain-Gloo floor, measured per bucket.
    assert set(m.native_s) == set(m.plan.setup.buckets) and min(m.native_s.values()) > 0
    calibrated = simulate_training(**m.plan.setup.sim_kwargs(10, ex.seed),
                                   native_s=lambda n: m.native_s[n])
    np.testing.assert_array_equal(m.predicted.step_times, calibrated.step_times)
    assert any(lbl.startswith("measured, 2×1 real ranks") for lbl in labels(ex._axes["throughput"]))
    bars = ex._axes["measured"][1][0]
    assert bars.lines[0].get_ydata()[0] == pytest.approx(m.throughput(50))
    assert "Measured on 2×1 real ranks" in ex.summary.value
    assert not ex.run_button.disabled and ex.cancel_button.disabled
    ex.set(nodes=16)  # another N: the measured point stays where it was measured
    quiet(ex).update()
    assert ex.measured_now is m and "measured" in " ".join(labels(ex._axes["throughput"]))
    ex.set(latency_us=50)  # another network: the measurement no longer applies
    quiet(ex).update()
    assert ex.measured_now is None and "measured" not in " ".join(labels(ex._axes["throughput"]))


def test_cancel_stops_the_real_cluster():
    ex = quiet(ThroughputExplorer(nodes=4, model_mib=1, compute_ms=200, real_steps=50))
    ex.on_run_clicked(None)
    deadline = time.monotonic() + 20
    while ex.progress.value < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ex.progress.value >= 1 and ex.runner.running
    assert len(live_children()) >= 4  # the ranks are up
    ex.on_cancel(None)
    assert not ex.runner.running and ex.status.value == "cancelled"
    assert ex.measured is None and ex.runner.error is None
    assert live_children() == []  # checked again by the fixture


def test_real_plan_fits_this_machine():
    ex = quiet(ThroughputExplorer(nodes=256, procs_per_node=4, model_mib=1000))
    plan = ex.real_plan()
    assert (plan.setup.nodes, plan.setup.procs_per_node) == (2, 4)
    assert plan.setup.model_mib == 4 and plan.setup.ranks <= 8
    assert ThroughputExplorer(nodes=256).real_plan().setup.nodes == 8


# --- the link explorer ---------------------------------------------------------------------


def test_link_explorer_shows_the_link_models_delays():
    le = quiet(LinkExplorer("delay 2ms 500us distribution normal"))
    le.update()
    assert le.last_error is None and le.parse_error is None
    spec = Netem.parse("delay 2ms 500us distribution normal")
    delays = LinkModel(spec, seed=0).one_way_delays(5000, interval_ns=le._interval_ns(spec))
    np.testing.assert_array_equal(le.delays, delays)
    for q in (50, 90, 99):
        assert le.percentiles[q] == pytest.approx(np.percentile(delays, q))
        assert le._axes["q"][q].get_xdata()[0] == pytest.approx(np.percentile(delays, q) / 1e6)
    assert f"{np.percentile(delays, 99) / 1e6:.4g} ms" in le.table.value
    assert labels(le._axes["density"])[:2] == ["link model", "configured (netem table)"]
    kind, law = configured_law_ns(spec)  # what the figure draws: netem's own delays
    assert kind == "table" and np.array_equal(law, delay_values_ns(spec))
    kind, law = configured_law_ns(Netem.parse("delay 1ms 1ms rate 8mbit"))
    assert kind == "uniform" and law.tolist() == [HEADER_BYTES * US, 2 * MS + HEADER_BYTES * US]
    expected_p99 = 2e6 + models.jitter_quantile(0.99, "normal", 500e3)
    assert f"{expected_p99 / 1e6:.4g} ms" in le.table.value  # the configured column
    le.close()


def test_link_sliders_write_netem_and_bad_input_is_named():
    le = quiet(LinkExplorer("delay 1ms"))
    le.sliders["jitter_us"].value = 200
    le.distribution.value = "pareto"
    le.sliders["rate_mbit"].value = 100
    assert le.text.value == "delay 1ms 200us distribution pareto rate 100mbit"
    quiet(le).update()
    assert le.spec == Netem.parse(le.text.value)

    le.set_spec("delay 2ms 500us distribution bogus")
    quiet(le).update()  # does not raise
    with pytest.raises(ValueError) as exc:
        Netem.parse("delay 2ms 500us distribution bogus")
    assert le.last_error is None and le.parse_error == str(exc.value)
    assert "ValueError" in le.error_box.value and "unknown distribution" in le.error_box.value
    assert le._axes["error"].get_text().replace("\n", " ") == f"ValueError: {exc.value}"
    assert Figure is type(le.figure())  # the static figure shows the error too
    le.set_spec("delay 2ms")
    quiet(le).update()
    assert le.error_box.value == "" and le.spec.delay_ns == 2_000_000
    le.close()


def test_link_measure_for_real_overlays_two_ranks():
    le = quiet(LinkExplorer("delay 1ms"))
    le.update()
    le.on_measure_clicked(None)
    assert le.runner.join(20), le.status.value
    assert le.measured is not None, le.status.value
    median = float(np.median(le.measured))
    assert 1e6 <= median < 6e6  # 1 ms of netem plus this machine's software overhead
    assert "measured, 2 real ranks" in labels(le._axes["density"])
    assert "measured (" in le.table.value


# --- the ring stepper ----------------------------------------------------------------------


def test_chunk_counts_follow_the_ring_algorithm():
    p = 5
    assert (chunk_counts(p, 0) == 1).all()
    after_rs = chunk_counts(p, p - 1)
    for r in range(p):  # rank r owns the complete chunk r + 1
        assert after_rs[r, (r + 1) % p] == p
        assert (after_rs[r] == p).sum() == 1
    assert (chunk_counts(p, 2 * (p - 1)) == p).all()
    # Every round of reduce-scatter adds p contributions in total.
    assert chunk_counts(p, 1).sum() == p * p + p


def test_ring_timeline_matches_schedule_play_and_shows_the_slow_link():
    p, n = 4, 8 * 2**20
    topo = Topology.build(p, 1, "delay 100us rate 10gbit", links={(1, 2): "delay 100us rate 1gbit"})
    tl = ring_timeline(topo, n, seed=3)
    done = play(QueueState(topo), Collective("allreduce", n), np.zeros(p, dtype=np.int64),
                np.random.default_rng(3))
    np.testing.assert_array_equal(tl.ready_ns[-1], done)
    assert tl.rounds == 6 and tl.total_ns == done.max()

    rs = quiet(RingStepper(p=4, slow_link=1))
    rs.update()
    assert rs.timeline.total_ns > 3 * rs.baseline.total_ns  # a 10x slower link dominates
    for _ in range(3):
        rs.on_step(None)
    quiet(rs).update()
    assert rs.step == 3 and (rs.counts == chunk_counts(4, 3)).all()
    assert rs._axes["cells"][0][1].get_text() == "✓"
    assert "slow link 1 → 2" in labels(rs._axes["timeline"])
    assert rs._axes["now"].get_xdata()[0] == pytest.approx(rs.timeline.ready_ns[2].max() / 1e6)
    rs.on_back(None)
    rs.on_reset(None)
    rs.p_slider.value = 6
    quiet(rs).update()
    assert rs.step_slider.max == 10 and rs.counts.shape == (6, 6) and rs.slow_link == (1, 2)
    rs.close()


# --- static mode ---------------------------------------------------------------------------


def test_show_returns_a_static_figure_without_a_front_end(monkeypatch):
    assert not frontend_available()  # pytest: no kernel
    for explorer in (ThroughputExplorer(nodes=8), LinkExplorer(), RingStepper(p=3)):
        fig = explorer.show()
        assert isinstance(fig, Figure) and len(fig.axes) >= 2
        quiet(explorer).close()
    fig = RingStepper(p=3).figure()
    assert fig.axes[0].get_xlabel() == "chunk"

    class Kernel:
        comm_manager = object()

    class Shell:
        kernel = Kernel()

    import IPython

    monkeypatch.delenv("CLUSTERLAB_STATIC", raising=False)  # test.sh sets it for nbval
    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    assert frontend_available()
    monkeypatch.setenv("CLUSTERLAB_STATIC", "1")
    assert not frontend_available()
    assert isinstance(LinkExplorer().show(), Figure)
