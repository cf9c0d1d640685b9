"""Notebooks 10 and 10b (review r10): the step-time verdict prints how far the farthest growth
was from its closed form, the "At real scale" figure draws both layouts' terms with their
crossings, and the pipeline figure draws one row of timelines per network."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from clusterlab import parallelism as par  # noqa: E402
from clusterlab.experiments import common  # noqa: E402
from clusterlab.lessons import sharding_and_parallelism_traffic as l10  # noqa: E402
from clusterlab.lessons import tensor_pipeline_expert_parallelism as l10b  # noqa: E402


@pytest.fixture(autouse=True)
def quiet_machine_no_windows(monkeypatch):
    monkeypatch.setattr(common, "load_per_core", lambda: 0.0)
    figures = []
    monkeypatch.setattr(plt, "show", lambda: figures.append(plt.gcf()))
    yield figures
    plt.close("all")


def _row(nic, ddp, fsdp, ddp_comm, fsdp_comm):
    return {"nic": nic, "ddp_s": ddp, "fsdp_s": fsdp, "ddp_comm_s": ddp_comm,
            "fsdp_comm_s": fsdp_comm, "ddp_predicted_s": ddp, "fsdp_predicted_s": fsdp,
            "ddp_sent": 100, "fsdp_sent": 150, "steps": 8}


def _sweep(fsdp_hi):
    return [_row("delay 1ms", 0.010, 0.020, 0.004, 0.018),
            _row("delay 5ms", 0.018, 0.056, 0.012, 0.054),
            _row("delay 10ms", 0.028, fsdp_hi, 0.022, 0.099),
            _row("delay 1ms rate 50mbit", 0.042, 0.068, 0.036, 0.066)]


def test_step_time_verdict_names_the_farthest_growth(capsys):
    assert l10.explain_step_times(_sweep(0.1091)) is True  # FSDP2 +89.1 ms against +81 ms
    out = " ".join(capsys.readouterr().out.split())
    assert "within 20% of its closed form (the farthest 10% off" in out


def test_step_time_verdict_fails_a_quarter_off_on_a_quiet_machine():
    with pytest.raises(AssertionError, match="not shown on a quiet machine"):
        l10.explain_step_times(_sweep(0.1213))  # FSDP2 +101.3 ms against +81 ms: 25% off


def test_step_time_miss_within_the_runs_own_scatter_is_not_shown_not_raised(capsys):
    sweep = _sweep(0.1213)  # FSDP2 20.3 ms over its closed form
    for row, scatter in zip(sweep, (0.012, 0.0, 0.009, 0.0)):  # 1ms and 10ms: 21 ms together
        row["fsdp_spread_s"] = scatter
    assert l10.explain_step_times(sweep) is False
    out = " ".join(capsys.readouterr().out.split())
    # the 2x part held, so the headline names only the part that failed: the 20% check
    assert out.startswith("Not shown on this run: every growth within 20% of its closed form "
                          "(the farthest 25% off its closed-form growth), though FSDP2's step "
                          "did grow")
    assert "within their runs' own scatter: FSDP2 101.3 ms against 81.0 ms, scatter 21.0 ms" \
        in out
    sweep[0]["fsdp_spread_s"] = 0.010  # 19 ms of scatter: the 20.3 ms miss is beyond it
    with pytest.raises(AssertionError, match="not shown on a quiet machine"):
        l10.explain_step_times(sweep)


def test_real_scale_figure_marks_both_crossings(quiet_machine_no_windows):
    cross = {"one": 625, "node": 240}
    l10.plot_at_real_scale(7e9, units=32, cross=cross)
    (fig,) = quiet_machine_no_windows
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 6  # rounds and bytes per layout, and the two crossings
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["crossing: 625 ranks", "crossing: 240 ranks"]


def test_real_scale_constants_come_from_the_ledger():
    c = l10.real_scale_constants()
    assert c["a_net"] > c["a_nv"] > 0 and c["node"] == c["node_nics"] and c["nic_bw"] > 1e9


def _pipe(nic, schedule):
    ops = [[("F", j, 0.01 * j, 0.01 * j + 0.005) for j in range(2)]
           + [("B", j, 0.05 + 0.01 * j, 0.055 + 0.01 * j) for j in range(2)]
           for _ in range(4)]
    return {"nic": nic, "schedule": schedule, "ops": ops, "bubble": 0.3,
            "bubble_formula": 0.27, "step_s": 0.5, "steps_kept_of": 7}


def test_pipeline_figure_has_one_row_per_network(quiet_machine_no_windows):
    pipe = [_pipe(n, s) for n in ("calm", "rough") for s in par.PIPELINE_SCHEDULES]
    l10b.plot_pipeline(pipe, nics=("calm", "rough"))
    (fig,) = quiet_machine_no_windows
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 4
    assert titles[0].startswith("GPipe, calm: bubble 30% measured, 27%")
    assert titles[3] == "1F1B, rough: step 500 ms, idle 30% (fastest of 7 steps)"
    # m = 2 < p: no round trip of micro-batch p to mark
    assert not [t for t in fig.axes[3].texts if "B(0)" in t.get_text()]


def test_pipeline_figure_marks_one_1f1b_round_trip(quiet_machine_no_windows):
    from clusterlab import parallelism as par

    pipe = []
    for nic in ("calm", "rough"):
        for s in par.PIPELINE_SCHEDULES:
            run = par.simulate_pipeline(s, stages=4, microbatches=8, forward_s=0.015,
                                        backward_s=0.030, nic="delay 10ms")
            ops = [[(k, j, run.start[(st, k, j)], run.end[(st, k, j)]) for k in "FB"
                    for j in range(8)] for st in range(4)]
            pipe.append({**_pipe(nic, s), "ops": ops})
    l10b.plot_pipeline(pipe, nics=("calm", "rough"))
    (fig,) = quiet_machine_no_windows
    assert [t.get_text() for t in fig.axes[3].texts if "B(0)" in t.get_text()] == [
        "end of B(0) to end of B(4): F(4) to stage 3 and back, ≥ 4(f+b) + 6 hops"]
    assert not [t for t in fig.axes[1].texts if "B(0)" in t.get_text()]  # calm row: none
