"""The lesson modules of notebooks 08b, 12 and 12b: what they decide from a run (verdicts,
classifications, formatted numbers), on small synthetic runs - no processes, no timing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from clusterlab import facts
from clusterlab.lessons import elastic_resharding as elastic_lesson
from clusterlab.lessons import failures_and_elasticity as failures_lesson
from clusterlab.lessons import mismatched_collectives_and_hangs as hangs_lesson

# --- 08b: mismatched collectives and hangs --------------------------------------------------

DETAIL_MSG = "Detected mismatch between collectives on ranks. Rank 0 is running ALLREDUCE"


def _mismatches(**override):
    """Six runs shaped like divergence.mismatched_collective's, as the notebook expects them."""
    runs = {
        ("op", None): {"error": "ClusterTimeout", "ranks": [0, 1]},
        ("size", None): {"error": "RankDied", "ranks": [0]},
        ("smaller", None): {"error": "ClusterTimeout", "ranks": [0],
                            "message": "still inside: rank 0; returned already: rank 1",
                            "inputs": [[1.0] * 4, [2.0] * 2], "sum": 3.0,
                            "returned": {1: [3.0, 1.0]}, "held": {1: "rank 0's data"}},
    }
    for case in ("op", "size", "smaller"):
        runs[case, "DETAIL"] = {"error": "RankError", "ranks": [0, 1], "message": DETAIL_MSG}
    out = {}
    for (case, debug), r in runs.items():
        out[case, debug] = {"case": case, "debug": debug, "wall_s": 0.4 if debug else 2.0,
                            "said": "nothing", "message": "", **r}
    for key, changes in override.items():
        out[tuple(key.split("__")) if "__" in key else (key, None)].update(changes)
    return out


def test_outcome_row_aligns_columns_and_wraps_what_it_says_under_its_column():
    m = {"case": "op", "debug": None, "error": "ClusterTimeout", "ranks": [0, 1],
         "wall_s": 2.42, "said": "word " * 40}
    lines = hangs_lesson.outcome_row(m).splitlines()
    assert lines[0].startswith("op      None    ClusterTimeout  [0, 1]   2.42s  word")
    indent = len("op      None    ClusterTimeout  [0, 1]   2.42s  ")
    assert len(lines) > 1 and all(line.startswith(" " * indent + "word") for line in lines[1:])
    assert all(len(line) <= 100 for line in lines)
    # a RankError names only the first rank to report; every rank raises under DETAIL
    detail = hangs_lesson.outcome_row({**m, "debug": "DETAIL", "error": "RankError",
                                       "ranks": [1], "wall_s": 0.3})
    assert detail.startswith("op      DETAIL  RankError       -        0.30s  word")


def test_legend_gives_the_bound_and_the_start_up_and_teardown_beyond_it(capsys):
    lines = hangs_lesson.legend_lines(_mismatches(), plain_timeout_s=1.6)
    assert [line.split(":")[0].strip() for line in lines] == [
        "outcome", "ranks", "after", "what it says"]
    assert "at its bound (1.6 s;" in lines[0]
    assert ("bound plus about 0.4 s: clusterlab collecting the stuck ranks' stacks, and its "
            "start-up and teardown") in " ".join(lines[2].split())
    assert all(len(row) <= 96 for line in lines for row in line.splitlines())
    no_timeout = _mismatches(op={"error": "RankDied"}, smaller={"error": "RankDied"})
    assert "bound plus" not in hangs_lesson.legend_lines(no_timeout, plain_timeout_s=2)[2]
    hangs_lesson.print_outcomes(_mismatches())
    assert "key:" not in capsys.readouterr().out
    hangs_lesson.print_outcomes(_mismatches(), plain_timeout_s=1.6)
    assert "key:" in capsys.readouterr().out


def test_smaller_marks_a_wrong_result_as_silent_and_a_right_one_not():
    small = _mismatches()["smaller", None]
    wrong = hangs_lesson.smaller_lines(small)
    assert wrong[0].endswith("(the right sum: 3 in each element)")
    assert wrong[1].endswith(", a wrong result, silently")
    right = hangs_lesson.smaller_lines({**small, "returned": {1: [3.0, 3.0]}})
    assert not right[1].endswith("silently")


def test_check_mismatches_accepts_the_run_the_text_describes_and_refuses_others():
    hangs_lesson.check_mismatches(_mismatches(), detail_timeout_s=5)
    with pytest.raises(AssertionError):  # rank 1 returned the right sum: not the silent case
        hangs_lesson.check_mismatches(_mismatches(smaller={"returned": {1: [3.0, 3.0]}}),
                                      detail_timeout_s=5)
    with pytest.raises(AssertionError, match="before the timeout"):
        hangs_lesson.check_mismatches(_mismatches(op__DETAIL={"wall_s": 5.0}),
                                      detail_timeout_s=5)


def _swap(agree=False):
    r = {"error": None, "message": "", "wall_s": 0.1, "ranks_agree": agree,
         "result": [{"layer_a": [21.0], "layer_b": [12.0]}, {"layer_a": [12.0], "layer_b": [21.0]}],
         "expected": {"layer_a": [3.0], "layer_b": [30.0]},
         "wrong": [["layer_a", "layer_b"], ["layer_a", "layer_b"]]}
    return {None: dict(r), "DETAIL": dict(r)}


def test_swap_lines_name_each_mode_and_rank_and_the_correct_sums():
    lines = hangs_lesson.swap_lines(_swap())
    assert lines[0] == "TORCH_DISTRIBUTED_DEBUG=OFF: error None; after 0.1 s"
    assert lines[1] == "    rank 0: layer_a = 21, layer_b = 12"
    assert lines[3].startswith("TORCH_DISTRIBUTED_DEBUG=DETAIL")
    assert lines[-1] == "correct: layer_a = 3, layer_b = 30; ranks agree: False"
    hangs_lesson.check_swap(_swap())
    with pytest.raises(AssertionError):
        hangs_lesson.check_swap(_swap(agree=True))


def test_skip_names_the_missing_rank_or_none_and_checks_the_bound(capsys):
    skip = {None: {"waits_s": [2.0, 2.0, 0.0], "messages": ["Timed out a", "Timed out b", ""],
                   "named_ranks": []},
            "DETAIL": {"waits_s": [2.1, 2.2, 0.0], "named_ranks": [2],
                       "messages": ["missing rank 2", "check rank 0 Original exception: x", ""]}}
    lines = hangs_lesson.skip_lines(skip)
    assert lines[:4] == ["TORCH_DISTRIBUTED_DEBUG=OFF:",
                         "    rank 0 raised after 2.0 s: Timed out a",
                         "    rank 1 raised after 2.0 s: Timed out b",
                         "    ranks named as missing by rank 0: none"]
    assert lines[6] == "    rank 1 raised after 2.2 s: check rank 0"  # the wrapped cause cut
    assert lines[7] == "    ranks named as missing by rank 0: [2]"
    hangs_lesson.explain_skip(skip, wait_s=2.0)
    with pytest.raises(AssertionError, match="bounded by the timeout"):
        hangs_lesson.explain_skip(skip, wait_s=3.0)
    quiet = {**skip, None: {**skip[None], "messages": ["Timed out a", "closed", ""]}}
    with pytest.raises(AssertionError, match="ranks 0, 1 time out"):
        hangs_lesson.explain_skip(quiet, wait_s=2.0)


def test_barrier_line_says_when_rank_0_raised_and_the_check_refuses_an_early_error(capsys):
    mb = {"waits_s": [0.52, 0.53, None], "named_ranks": [2],
          "message": "[Rank 0]: Ranks 2 failed to pass monitoredBarrier in 500 ms"}
    assert hangs_lesson.barrier_line(mb, late_s=1.5) == (
        "rank 0 raised after 0.5 s (the late rank was stuck for 1.5 s): [Rank 0]: Ranks 2 "
        "failed to pass monitoredBarrier in 500 ms")
    hangs_lesson.explain_barrier(mb, barrier_timeout_s=0.5, late_s=1.5)
    with pytest.raises(AssertionError, match="barrier's timeout"):
        hangs_lesson.explain_barrier({**mb, "waits_s": [0.1, 0.1, None]}, barrier_timeout_s=0.5,
                                     late_s=1.5)


def test_skip_figure_labels_say_who_is_named_and_draw_without_error():
    assert hangs_lesson._skip_label("x", [2]) == "raises: names rank 2"
    assert hangs_lesson._skip_label("Timed out waiting", []).endswith("names nobody")
    assert "check rank 0" in hangs_lesson._skip_label(
        "Please check rank 0 logs. Original exception: Timed out", [])
    import matplotlib

    matplotlib.use("Agg")
    skip = {None: {"waits_s": [2.0, 2.0, 0.0], "messages": ["Timed out a", "Timed out b", ""],
                   "named_ranks": []},
            "DETAIL": {"waits_s": [2.1, 2.2, 0.0], "named_ranks": [2],
                       "messages": ["missing rank 2", "check rank 0 logs", ""]}}
    hangs_lesson.plot_skip(skip, wait_s=2.0)


@pytest.mark.parametrize("template", [hangs_lesson.hang_checklist, hangs_lesson.hang_settings,
                                      hangs_lesson.detail_coverage, elastic_lesson.cost_text])
def test_ledger_templates_name_only_facts_the_ledger_has(template):
    text = template()
    assert facts.placeholders(text)
    facts.render(text)  # raises KeyError for a fact the ledger lacks


# --- 12: failures, restarts and checkpoints -------------------------------------------------


def test_young_lines_state_the_minimum_and_the_halved_interval_part():
    lines = failures_lesson.young_lines(checkpoint_s=60.0, mtbf_s=10800.0, restart_s=600.0)
    # sqrt(2 * 60 * 10800) = 1138 s; restarts alone 600 / 10800 = 5.6%
    assert lines[0].startswith("Young's interval 1138 s;")
    assert lines[0].endswith("of which the restarts alone are 5.6%")
    assert "(halved)" in lines[2] and lines[2].startswith("checkpoints 4x faster: interval 569 s")


def test_waste_curve_spans_2_minutes_to_half_the_mtbf_below_the_cap():
    taus, waste = failures_lesson.waste_curve(checkpoint_s=60.0, mtbf_s=10800.0,
                                              restart_s=600.0)
    assert taus[0] == pytest.approx(120.0) and taus[-1] == pytest.approx(5400.0)
    assert max(waste) < 1.0  # no plateau: the first-order formula is never capped here


def test_schedule_line_compares_the_mtbf_with_one_restart():
    args = dict(first={"step_s": 0.05}, mtbf_steps=12, tau=0.2, interval=4, predicted=15.0)
    short = failures_lesson.schedule_line([5, 17], failure={"restart_s": 4.0}, **args)
    assert "MTBF 12 steps = 0.60 s of work, shorter than one restart (4.00 s)" in short
    assert short.endswith("so Young's interval, 200 ms = 4 steps, is only a rule of thumb "
                          "here")
    assert "outside Young's regime" in short
    long = failures_lesson.schedule_line([5], failure={"restart_s": 0.3}, **args)
    assert "longer than one restart" in long and "outside Young's regime" not in long
    assert long.endswith("; Young's interval 200 ms = 4 steps")
    with pytest.raises(AssertionError, match="at least one failure"):
        failures_lesson.explain_schedule([], failure={"restart_s": 4.0}, **args)


def _job(train_s, restarts=(4.0, 5.0), redo=0.05):
    summary = {"step_s": 0.06, "startup_s": 3.0, "checkpoints": 10, "checkpoint_s": 0.04,
               "train_s": train_s, "wall_s": train_s + 5.0, "failures": len(restarts),
               "goodput_steps_per_s": 2.0}
    fails = [{"restart_s": r, "redo_s": redo} for r in restarts]
    return SimpleNamespace(summary=lambda: dict(summary), failures=lambda: list(fails),
                           returncode=0, leftover=[])


def test_time_parts_adds_the_unaccounted_rest_only_above_10_ms():
    accounted = 30 * 0.06 + 3.0 + 10 * 0.04 + 9.0 + 0.1
    parts, other = failures_lesson.time_parts(_job(accounted + 0.5), steps=30)
    assert other == pytest.approx(0.5) and parts["unaccounted"] == pytest.approx(0.5)
    assert parts["restarts"] == pytest.approx(9.0) and parts["steps"] == pytest.approx(1.8)
    parts, other = failures_lesson.time_parts(_job(accounted + 0.005), steps=30)
    assert "unaccounted" not in parts


def test_explain_goodput_refuses_a_job_whose_interval_part_rivals_its_restarts(capsys):
    failures_lesson.explain_goodput(_job(20.0), first={"step_s": 0.05}, ideal=1.5,
                                    schedule=[5, 17])
    out = capsys.readouterr().out
    assert ("goodput 10% useful work, of its training time (from the first worker's first "
            "event): 2.0 steps/s against a bare step rate (1 / step time) of 20.0") in out
    assert "6% of torchrun's whole run, which adds torchrun's start-up" in out
    with pytest.raises(AssertionError, match="restarts, not the interval"):
        failures_lesson.explain_goodput(_job(20.0, restarts=(0.5, 0.5)), first={"step_s": 0.05},
                                        ideal=1.5, schedule=[5, 17])


def test_estimate_rows_use_the_first_jobs_samples_and_the_steps_since_a_checkpoint():
    parts = {"start-up": 3.1, "steps": 1.9, "checkpoints": 0.5, "restarts": 9.5,
             "redone steps": 0.2}
    rows = failures_lesson.estimate_rows(
        first={"startup_s": 3.0, "step_s": 0.1, "checkpoint_s": 0.04},
        failure={"restart_s": 4.0}, parts=parts, other=0.3, schedule=[5, 13], steps=30,
        interval=4)
    est = {name: e for name, e, _ in rows}
    assert est["steps"] == pytest.approx(3.0) and est["restarts"] == pytest.approx(8.0)
    assert est["checkpoints"] == pytest.approx(7 * 0.04)  # saves after steps 4, 8, ..., 28
    assert est["redone steps"] == pytest.approx((1 + 1) * 0.1)  # 5 - 4, 13 - 12
    assert rows[-1] == ("unaccounted", 0.0, 0.3)


def test_estimate_lines_name_the_worst_row_and_cancelling_misses():
    rows = [("start-up", 3.0, 4.0), ("restarts", 8.0, 7.1), ("the rest", 0.0, 0.0)]
    lines = failures_lesson.estimate_lines(rows, predicted=11.0, train_s=11.1)
    assert lines[-3].startswith("total")
    assert "the largest difference is in the start-up row (+1.00 s)" in lines[-2]
    assert "misses of opposite sign offset" in lines[-2]
    assert lines[-1].startswith("the total held within 10%")
    rows = [("start-up", 3.0, 5.0), ("the rest", 0.0, 0.0)]
    lines = failures_lesson.estimate_lines(rows, predicted=3.0, train_s=5.0)
    assert "offset" not in lines[-2] and lines[-1] == "the total missed by over 10% on this run"
    rows = [("start-up", 0.68, 0.05), ("steps", 3.0, 3.03), ("restarts", 5.1, 3.64)]
    lines = failures_lesson.estimate_lines(rows, predicted=8.78, train_s=6.72)
    assert "offset" not in lines[-2]  # +0.03 s against -2.09 s: no cancelling to speak of
    assert "mostly of one sign (+0.03 s against -2.09 s), so they added up" in lines[-2]


def test_compare_estimate_checks_the_unaccounted_share_silently(capsys):
    rows = [("steps", 1.0, 1.0), ("unaccounted", 0.0, 0.1)]
    failures_lesson.compare_estimate(rows, predicted=1.0, second={"train_s": 10.0}, other=0.1)
    out = capsys.readouterr().out
    assert "Accounting check" not in out and "Shown on this run" not in out
    with pytest.raises(AssertionError):  # the rows must add up to the estimate
        failures_lesson.compare_estimate(rows, predicted=2.0, second={"train_s": 10.0},
                                         other=0.1)
    with pytest.raises(AssertionError, match="account for the job's time"):
        failures_lesson.compare_estimate(rows, predicted=1.0, second={"train_s": 10.0},
                                         other=1.5)


def test_compare_estimate_shows_the_row_its_headline_names_and_what_it_holds(capsys):
    rows = [("start-up", 0.03, 0.73), ("steps", 1.65, 1.64), ("restarts", 2.82, 3.31),
            ("unaccounted", 0.0, 0.01)]
    failures_lesson.compare_estimate(rows, predicted=4.5, second={"train_s": 5.69}, other=0.01)
    out = capsys.readouterr().out
    short = out.split("start-up: the first job's")[0]
    assert "the largest difference is in the start-up row (+0.70 s)" in short
    assert "\nstart-up            0.03        0.73       +0.70" in short  # its row, visible
    assert "\nrestarts" in short and "\ntotal" in short and "\nsteps*" not in short
    assert "start-up: the first job's 0.03 s against the second's 0.73 s. Timed from the " \
           "first worker's first event" in out


def test_young_lines_set_the_redone_work_against_the_restart():
    lines = failures_lesson.young_lines(checkpoint_s=60.0, mtbf_s=10800.0, restart_s=600.0)
    assert lines[3] == ("per failure, on average: half an interval, 569 s of redone work, "
                        "against the restart's 600 s: at this scale the two are comparable")


def test_restart_miss_lines_say_how_far_the_first_restart_sat_and_what_it_made():
    job2 = _job(20.0, restarts=(1.62, 1.63))
    fails = [{"restart_s": 1.62, "respawn_s": 1.60}, {"restart_s": 1.63, "respawn_s": 1.60}]
    job2.failures = lambda: list(fails)
    lines = failures_lesson.restart_miss_lines(
        failure={"restart_s": 1.98, "respawn_s": 1.95}, job2=job2, predicted=20.88)
    assert "first job 1.98 s (1.95 s), the one the estimate used; second job 1.62 s (1.60 s)" \
        in lines[0]
    assert lines[1] == ("the first job's restart was 0.35 s slower than the second job's mean "
                        "(and slower than each); over 2 restarts that makes the restarts row's "
                        "-0.71 s, against the total's -0.88 s miss")
    mixed = [{"restart_s": 1.5, "respawn_s": 1.4}, {"restart_s": 2.5, "respawn_s": 2.4}]
    job2.failures = lambda: list(mixed)
    line = failures_lesson.restart_miss_lines(
        failure={"restart_s": 1.8, "respawn_s": 1.7}, job2=job2, predicted=19.0)[1]
    assert "0.20 s faster than the second job's mean;" in line and "+0.40 s" in line


def test_explain_hung_returns_the_overshoot_and_refuses_a_named_rank(capsys):
    hung = [{"timeout_s": 0.5, "waited_s": [0.52, 0.51], "errors": ["Timed out"]},
            {"timeout_s": 1.0, "waited_s": [1.03, 1.01], "errors": ["Timed out"]}]
    overshoot, waits = failures_lesson.explain_hung(hung)
    assert overshoot == pytest.approx(0.03) and waits == 4
    assert "overshot its configured timeout by 30 ms (4 waits)" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="names nobody"):
        failures_lesson.explain_hung([{**hung[0], "errors": ["Rank 2 failed to pass"]}])
    with pytest.raises(AssertionError):  # a wait past the timeout + 0.5 s
        failures_lesson.explain_hung([{**hung[0], "waited_s": [1.2]}])


def _stall(sync_lost=0.06, async_lost=0.01, noise_max=0.005, write=(0.05, 0.05),
           lost_s=(0.05, 0.06), blocked=(0.05, 0.002), after=0.09, copy=0.002,
           async_lost_s=None):
    base = {"step_s": 0.04, "noise_s": 0.001, "noise_max_s": noise_max, "after_n": 6,
            "rank1_step_s": 0.04, "saves": len(lost_s), "window_steps": 5}
    return {"sync": {**base, "lost_per_save_s": sync_lost, "write_s": write[0],
                     "lost_s": list(lost_s), "blocked_s": blocked[0], "after_s": after,
                     "copy_s": 0.0},
            "async": {**base, "lost_per_save_s": async_lost, "write_s": write[1],
                      "lost_s": list(async_lost_s or [async_lost] * len(lost_s)),
                      "blocked_s": blocked[1], "after_s": 0.04, "copy_s": copy}}


@pytest.mark.parametrize("sync_lost, async_lost, says", [
    (0.060, 0.010, "the asynchronous save cost the job 50 ms less per save"),
    (0.010, 0.060, "the asynchronous save cost the job 50 ms more per save"),
    (0.012, 0.010, "the two modes' cost per save differed by 2 ms, within the 5 ms floor"),
])
def test_stall_verdict_counts_a_difference_only_beyond_the_noise_floor(sync_lost, async_lost,
                                                                      says):
    assert failures_lesson.stall_verdict(_stall(sync_lost, async_lost)).startswith(says)


def test_stall_holds_needs_a_longer_block_and_rank_1_waiting_for_half_the_write():
    assert failures_lesson.stall_holds(_stall())
    assert not failures_lesson.stall_holds(_stall(blocked=(0.05, 0.047)))  # within the floor
    assert not failures_lesson.stall_holds(_stall(after=0.06))  # grew 20 ms < half of 50 ms
    assert not failures_lesson.stall_holds(_stall(blocked=(0.05, 0.02)))  # 20 ms > copy + floor


def test_stall_table_shows_the_copy_every_save_and_the_noise_floor():
    lines = failures_lesson.stall_table_lines(_stall(write=(0.05, 0.08), lost_s=(0.02, 0.05)))
    assert lines[0].split()[:6] == ["mode", "saving", "step", "blocked", "copy", "write"]
    assert lines[1].split() == ["sync", "50", "-", "50", "60", "2"]
    assert lines[2].split() == ["async", "2", "2", "80", "10", "2"]
    assert lines[3] == "lost per save, each (ms): sync 20, 50; async 10, 10"
    assert lines[-1] == "without saves the same windows were off by 1 ms (median), 5 ms at most: " \
                        "the noise floor"
    assert len(lines) == 5  # no comparison of the two writes, no guess at a cause
    slow = failures_lesson.stall_table_lines(_stall(lost_s=(0.05, 0.15)))  # 150 ms: 2.5x 60 ms
    assert slow[4] == "sync: its slowest save lost 2.5x the median (not investigated here)"


def _async_traces(spike_at=None, steps=12):
    rank0 = [0.04] * steps
    rank1 = [0.04] * steps
    if spike_at is not None:
        rank0[spike_at] += 0.075
        rank1[spike_at] += 0.072
    return {"async": {"step_s": [rank0, rank1], "saved": [1, 6], "write_s": [0.05, 0.049],
                      "copy_s": [0.002, 0.002]}}


def test_async_outlier_line_places_a_spike_and_does_not_blame_the_save(capsys):
    stall = _stall(async_lost=0.004, async_lost_s=[0.003, 0.078])
    line = failures_lesson.async_outlier_line(_async_traces(spike_at=9), stall)
    assert line == ("async: its worst window (steps 6 to 10) lost 78 ms, 75 ms of it in step 9, "
                    "3 steps after the save (rank 1's step 9: +72 ms); that save's write took "
                    "49 ms; this run does not show whether the save caused it")
    quiet = _stall(async_lost=0.004, async_lost_s=[0.003, 0.008])  # 8 ms: under half of 60 ms
    assert failures_lesson.async_outlier_line(_async_traces(), quiet) is None
    failures_lesson.print_stall_table(stall, _async_traces(spike_at=9))
    assert "does not show whether the save caused it" in capsys.readouterr().out


def test_explain_stalls_gives_the_busy_reason_only_when_noise_exceeds_a_step(capsys):
    failures_lesson.explain_stalls(_stall(), "v")
    assert "Shown on this run: the saving step waited" in capsys.readouterr().out
    failures_lesson.explain_stalls(_stall(blocked=(0.05, 0.05), noise_max=0.05), "v")
    assert "Not shown on this run" in capsys.readouterr().out


@pytest.mark.parametrize("sync_lost, noise_max, says", [
    (0.0524, 0.0, False),  # 0.5 ms over a 52 ms write with a 0 ms floor: no evidence
    (0.058, 0.0, True),  # 8 ms over a 50 ms write: more than a tenth of it
    (0.058, 0.010, False),  # 8 ms, but the windows were off by up to 10 ms
])
def test_a_sync_save_costing_more_than_its_write_is_said_only_when_clear(sync_lost, noise_max,
                                                                         says, capsys):
    failures_lesson.explain_stalls(_stall(sync_lost=sync_lost, noise_max=noise_max,
                                          write=(0.05, 0.05)), "v")
    out = capsys.readouterr().out
    assert ("cost the job" in out and "more (" in out) is says, out


@pytest.mark.parametrize("errors, seen", [
    (["Connection reset by peer. Details"], '"Connection reset by peer"'),
    (["x" * 80], '"' + "x" * 60 + '"'),
    ([], "torchrun stopped the survivor first"),
])
def test_survivor_saw_quotes_the_peer_error_or_says_torchrun_stopped_it(errors, seen):
    assert failures_lesson.survivor_saw(errors) == seen
    text = failures_lesson.real_cluster_text(errors)
    assert f"on this run:\n{seen})" in text
    summary, experts = text.split("<details>", 1)
    assert "| case |" not in summary and "| case |" in experts  # the table is for experts
    facts.render(text)


def test_plot_restart_draws_the_restart_the_redone_steps_and_the_checkpoints(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from clusterlab.experiments.failures import JobRun

    ev = [{"kind": "process", "t": 0, "rank": r, "attempt": 0} for r in (0, 1)]
    ev += [{"kind": "step", "t": int(k * 1e8), "rank": r, "attempt": 0, "step": k}
           for k in range(1, 4) for r in (0, 1)]
    ev += [{"kind": "checkpoint", "t": int(2e8), "rank": 0, "attempt": 0, "step": 2,
            "seconds": 0.01},
           {"kind": "kill", "t": int(3.1e8), "rank": 1, "attempt": 0, "step": 3},
           {"kind": "process", "t": int(1.3e9), "rank": 0, "attempt": 1},
           {"kind": "process", "t": int(1.3e9), "rank": 1, "attempt": 1},
           {"kind": "resume", "t": int(1.4e9), "rank": 0, "attempt": 1, "step": 2},
           {"kind": "resume", "t": int(1.4e9), "rank": 1, "attempt": 1, "step": 2}]
    ev += [{"kind": "step", "t": int(1.4e9 + (k - 2) * 1e8), "rank": r, "attempt": 1, "step": k}
           for k in range(3, 5) for r in (0, 1)]
    job = JobRun(config={"nodes": 2, "interval": 2, "steps": 4}, returncode=0, wall_s=2.0,
                 events=ev, leftover=[])
    monkeypatch.setattr(plt, "show", lambda: None)
    failures_lesson.plot_restart(job)
    labels = plt.gca().get_legend_handles_labels()[1]
    plt.close("all")
    assert "restart 1.09 s" in labels and "redone: steps 3 to 3" in labels
    assert "checkpoints at steps 2" in labels


def test_measured_here_reports_ranges_and_the_share_of_useful_work():
    job2 = _job(20.0, restarts=(4.0, 6.0))
    traces = {"sync": {"step_s": [[0.04, 0.09, 0.04, 0.11]], "saved": [1, 3]}}
    hung = [{"timeout_s": 0.5}, {"timeout_s": 1.0}]
    text = failures_lesson.measured_here(
        failure={"restart_s": 5.0, "redo_s": 0.12}, job2=job2, traces=traces,
        stall=_stall(), hung=hung, overshoot=0.02, waits=4, loss_verdict="V", ideal=2.0,
        predicted=16.0)
    assert "a restart under torchrun took 4.00 to 6.00 s (3 restarts)" in text
    assert "timeouts of 0.5 and 1.0 s" in text
    assert ("a synchronous save of 32 MB blocked its step 50 ms (median; each save 50 to 70 ms, "
            "2 saves), an asynchronous one 2 ms (median)") in text
    assert ("useful work 10% of its training time (8% of torchrun's whole run), +25% off the "
            "estimate") in text


# --- 12b: elastic resharding ----------------------------------------------------------------


def test_group_lines_name_the_redone_steps_and_where_each_group_started():
    rounds = [{"world": 2, "from_step": 0, "to_step": 7, "loaded": None},
              {"world": 1, "from_step": 6, "to_step": 12, "loaded": {"step": 6, "world": 2}}]
    lines = elastic_lesson.group_lines(rounds)
    assert lines[0] == "group 0: world size 2, steps 1 to 7, from scratch"
    assert lines[1] == ("group 1: world size 1, steps 7 to 12 (step 7 redone), from the step-6 "
                        "checkpoint written by 2 ranks")
    rounds[1]["from_step"] = 3
    assert "(steps 4, 5, 6, 7 redone)" in elastic_lesson.group_lines(rounds)[1]


def test_restart_line_gives_the_restarts_spent_per_group():
    rounds = [{"restart": 0}, {"restart": 1}]
    assert elastic_lesson.restart_line(rounds, 2) == (
        "restarts node A's agent had spent (its worker's TORCHELASTIC_RESTART_COUNT): 0 for "
        "group 0, 1 for group 1, of 2 allowed")


def test_pause_lines_give_each_milestone_after_the_kill_and_what_it_added():
    f = {"step": 7, "detected_s": 0.062, "error": "Connection closed by peer. More",
         "spawned_s": 4.6, "regrouped_s": 5.6, "world_after": 1, "resumed_s": 7.2,
         "imported_s": 6.5}
    cfg = {"last_call_s": 2, "keep_alive_s": 1, "keep_alive_attempts": 2, "compute_s": 0.05}
    lines = elastic_lesson.pause_lines(f, cfg)
    assert lines[0] == ("node B died before step 8; node A's worker was told: "
                        "Connection closed by peer")
    assert lines[2].startswith("   0.06  A's worker is told") and "0.05 s compute" in lines[2]
    assert lines[3].startswith("   4.60  A's agent has started a new worker (+4.5 s): ")
    assert lines[4].startswith(" " * 9 + "whose waits")
    assert "(2 s after its last one, sent before the kill)" in lines[4]
    assert lines[4].endswith("then the last call (2 s)")  # the once-a-second poll: a fold
    assert lines[5] == "   5.60  its Python has started and imported torch (+1.0 s)"
    assert lines[6] == "   6.50  it has imported DCP and FSDP (+0.9 s)"
    assert lines[7] == "   7.20  it has loaded the checkpoint at world size 1 (+0.7 s)"


def _resharding(rank1_out_rows=0):
    per = [{"0.weight": [16, 16], "2.weight": [1, 32]},
           {"0.weight": [16, 16], "2.weight": [rank1_out_rows, 32]}]
    return {"saved_rank_shapes": per, "saved_world": 2, "loaded_world": 1,
            "loaded_shapes": {"0.weight": [32, 16], "2.weight": [1 + rank1_out_rows, 32]},
            "saved_shapes": {"0.weight": [16, 16]}, "identical": True,
            "moments_identical": True, "moments": 1154}


def test_shard_lines_find_the_tensor_held_whole_and_check_the_rows_add_up():
    lines = elastic_lesson.shard_lines(_resharding())
    assert lines[0] == (" 0.weight: at world size 2 rank 0 (16, 16), rank 1 (16, 16); "
                        "at world size 1 (32, 16)")
    assert lines[2] == "held whole by one rank, an empty shard on the other: 2.weight"
    assert "(exp_avg and exp_avg_sq: 2 × 577 parameters = 1154 numbers) True" in lines[3]
    bad = _resharding()
    bad["loaded_shapes"]["0.weight"] = [33, 16]
    with pytest.raises(AssertionError, match="add up"):
        elastic_lesson.shard_lines(bad)


def test_check_resharding_wants_the_output_row_on_rank_0_and_a_small_error():
    elastic_lesson.check_resharding(_resharding(), 6e-8)
    with pytest.raises(AssertionError):
        elastic_lesson.check_resharding(_resharding(), 1e-4)
    with pytest.raises(AssertionError, match="one row"):
        elastic_lesson.check_resharding(_resharding(rank1_out_rows=1), 6e-8)


def test_rerun_line_gives_the_repeated_steps_loss_per_world_size():
    losses = [(6, 2, 0.5), (7, 2, 0.4905701), (7, 1, 0.4905702), (8, 1, 0.48)]
    assert elastic_lesson.rerun_line(losses, 7) == (
        "step 7 ran twice: loss 0.490570 at world size 2 and 0.490570 at world size 1")


def test_death_text_carries_the_measured_delay_into_the_ledger_template():
    f = {"detected_s": 0.0625, "spawned_s": 4.5625, "resumed_s": 8.4}
    cfg = {"compute_s": 0.05, "keep_alive_s": 1, "keep_alive_attempts": 2, "last_call_s": 2,
           "collective_timeout_s": 20.0}
    text = elastic_lesson.death_text(f, cfg)
    assert "heard of it\n  62 ms after the kill" in text and "compute sleep of 0.05 s" in text
    assert "by default (20 s in this run)" in text
    # the table: the defaults' total from the ledger beside this run's measured parts
    assert "| 62 ms |" in text and "| 4.5 s (configured: at most 2 s, then 2 s) |" in text
    assert "| 0 s (its 15 s without heartbeats have passed) + 30 s |" in text
    assert "| 3.8 s (incl. this demo's check) |" in text and "**8.4 s**" in text  # 8.4 - 4.5625
    assert "**more than 64 s**" in text
    assert "| about 34 s (step 2 below), or 10 min (the watchdog) |" in text
    assert "8 tries of 4.3 s each, about 34 s" in text and "at least about" not in text
    assert "can dominate" not in text
    rendered = facts.render(text)  # step 2's sum of waits, from the ledger
    assert "NCCL_IB_TIMEOUT = 20<sup>" in rendered and ": 8 × 4.3 s ≈ 34 s<sup>" in rendered
    assert "That is the nominal value" in rendered  # adaptive retransmission times it otherwise
    assert "SIGKILL after up to 30 s<sup>" in rendered  # the agent's grace, from the ledger
    # the main path is the table and the --max-restarts default; the steps sit in a fold
    assert rendered.index("| **total** |") < rendered.index("<details>")
    assert rendered.index("0 restarts<sup>") < rendered.index("<details>")


def test_cost_text_reads_the_405b_state_at_llama_3s_storage_throughput():
    text = facts.render(elastic_lesson.cost_text())
    # 405e9 parameters x 12 bytes = 4.86 TB; at 2 TB/s 2.4 s, at a hundredth of it 4 min
    assert "4.9 TB for 405B" in text and "2 TB/s<sup>" in text
    # a lower bound on reading the bytes, not a load time
    assert ("reading 405B's state once takes no less than 2.4 s\n  (small beside the 64 s "
            "floor)") in text
    assert "4 min on" in text and "as little as seconds" not in text
    assert ("| after | R − 1 | (R − 1) × k | k − 1 (the surviving nodes of the dead node's "
            "replica) |") in text


def test_checkpoint_lines_name_the_top_level_keys_and_what_is_left_out():
    params = ["0.weight", "0.bias", "2.weight", "2.bias"]
    keys = ([f"model.{p}" for p in params]
            + [f"optim.state.{p}.{k}" for p in params for k in ("exp_avg", "exp_avg_sq", "step")]
            + [f"optim.param_groups.0.{k}" for k in ("lr", "betas", "eps", "params")])
    lines = elastic_lesson.checkpoint_lines(keys, 6)
    assert lines[0].endswith("2 top-level keys")
    assert lines[1] == "  model: 0.weight, 0.bias, 2.weight, 2.bias"
    assert lines[2] == ("  optim: exp_avg, exp_avg_sq, step for each of those 4 parameters, "
                        "and Adam's 3 settings (lr among them)")
    assert "ckpt-0006" in lines[4]
    with pytest.raises(AssertionError, match="top-level"):
        elastic_lesson.checkpoint_lines(keys + ["rng_0"], 6)


def test_sampler_lines_show_a_per_rank_count_repeating_positions_after_a_shrink():
    lines = elastic_lesson.sampler_lines(before=4, after=3, batch=2)
    assert lines[0].startswith("4 ranks, batch 2 each: step 1 trains positions 0-7")
    assert lines[1].endswith("step 2 trains positions 6, 7, 8, 9, 10, 11")
    assert lines[2] == "  repeated: 6, 7; skipped: none"
    grown = elastic_lesson.sampler_lines(before=3, after=4, batch=2)
    assert grown[2] == "  repeated: none; skipped: 6, 7"


def test_small_misses_of_both_signs_are_neither_cancelled_nor_added_up():
    from clusterlab.lessons.failures_and_elasticity import estimate_lines

    line = estimate_lines([("a", 1.0, 1.04), ("b", 1.0, 0.97)], predicted=2.0,
                          train_s=2.01)[-2]
    assert line.endswith("(+0.04 s)"), line
    assert "added up" not in line and "offset" not in line


def test_reshard_line_leads_with_what_the_load_showed():
    line = elastic_lesson.reshard_line(_resharding(), 6e-8)
    assert line.startswith("What this shows: at world size 1 the job loaded the checkpoint "
                           "written by 2 ranks")
    assert "equal to those saved, bit for bit" in line and "within 6e-08" in line
    assert "NOT equal" in elastic_lesson.reshard_line({**_resharding(), "identical": False}, 0.1)
