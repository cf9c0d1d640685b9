"""The lesson module of notebook 06 (races with asynchronous collectives): each verdict and
formatted number on small synthetic runs."""

from __future__ import annotations

import pytest

from clusterlab.lessons import async_collective_races as races


def _variant(reads=80, wrong=0, disagree=0, **extra):
    return {"reads": reads, "wrong_trials": wrong, "disagree_trials": disagree, **extra}


def _async(edit_wrong=80, read_wrong=80, edit_disagree=0, fix_wrong=0):
    v = {n: _variant(wrong=fix_wrong) for n in races.ASYNC_FIXES}
    v["read_before_wait"] = _variant(wrong=read_wrong, wrong_elements=0.997, local=0.96)
    v["edit_before_wait"] = _variant(wrong=edit_wrong, disagree=edit_disagree, edit_sent=0.737,
                                     edit_lost=0.0, edit_partly=0.25, wrong_elements=0.995)
    return {"variants": v, "trials": 20, "workers": 4, "add": 100.0}


def test_shares_of_each_outcome_add_up_and_name_the_values():
    shares = races._shares(_async())
    for v in shares.values():
        assert sum(share for _, share in v) == pytest.approx(1.0)
    assert [label for label, _ in shares["edit_before_wait"]] == [
        "410 (every rank's edit)", "210 or 310 (some ranks' edits)", "10 (no edit)",
        "110 (right by chance)", "anything else"]
    assert shares["edit_before_wait"][4][1] == pytest.approx(0.995 - 0.737 - 0.25)


def test_agreeing_wrong_trials_subtracts_disagreeing_and_possibly_right_trials():
    assert races.agreeing_wrong_trials(_async(edit_wrong=80, edit_disagree=3)) == 17
    # 8 right reads: at most 8 // 4 = 2 trials were right on every rank
    assert races.agreeing_wrong_trials(_async(edit_wrong=72, edit_disagree=3)) == 15


def test_explain_async_races_says_at_least_only_when_some_reads_were_right(capsys):
    races.explain_async_races(_async(), _async())
    out = capsys.readouterr().out
    assert ("read before wait(): wrong in 80 of 80 rank-trials; of all elements: 96.0% this "
            "rank's own value, 3.7% a partial sum, 0.3% the total, 10 (right).") in out
    assert ("edit before wait(): wrong in 80 of 80 rank-trials; of all elements: 73.7% 410 "
            "(every rank's edit), 25.0% 210 or 310 (some ranks' edits), 0.5% 110 (right by "
            "chance), 0.8% anything else.") in out  # 10 (no edit) at 0.0%: left out
    assert "every rank held the same wrong bytes in 20 of 20 trials" in out
    assert "happened to be right: 0 of 80 (1 MiB bucket), 0 of 80 (one element): none" in out
    races.explain_async_races(_async(edit_wrong=72, read_wrong=76), _async(read_wrong=80))
    out = capsys.readouterr().out
    assert "wrong bytes in at least 18 of 20 trials" in out
    assert "right: 4 of 80 (1 MiB bucket), 0 of 80 (one element): such a read passes" in out


def test_explain_async_races_asserts_the_fixes_were_right():
    with pytest.raises(AssertionError, match="wait_then_read"):
        races.explain_async_races(_async(fix_wrong=1), _async())
    with pytest.raises(AssertionError):
        races.explain_async_races(_async(read_wrong=0), _async())


def _hook(hook, wrong=0, differ=0, first=30.0, last=3.0, unreduced=0.0):
    return {"hook": hook, "workers": 4, "steps": 20, "rank_steps": 80, "wrong_steps": wrong,
            "differ_steps": differ, "unreduced": unreduced, "loss_first": first,
            "loss_last": last, "max_error": 0.9 if wrong else 1e-7}


def test_explain_hook_race_says_the_loss_fell_and_the_checksum_caught_it(capsys):
    races.explain_hook_race({"chained": _hook("chained"),
                             "unchained": _hook("unchained", 80, 20, last=24.0,
                                                unreduced=0.92)})
    out = capsys.readouterr().out
    assert "unchained hook: gradient wrong in 80 of 80 rank-steps" in out
    assert ("  In the unchained run's wrong rank-steps, 92% of the gradient's elements were this "
            "rank's own / 4: unreduced (counted where own / 4 differs from the true "
            "average).") in out
    assert "chained hook: gradient wrong in 0 of 80 rank-steps (4 ranks x 20 steps);" in out
    assert "The loss fell under both hooks (8.0x higher at the end" in out
    assert "the replica checksum did" in out


def test_explain_hook_race_does_not_claim_a_fall_that_did_not_happen(capsys):
    races.explain_hook_race({"chained": _hook("chained"),
                             "unchained": _hook("unchained", 80, 20, last=40.0)})
    out = capsys.readouterr().out
    assert "The loss did not fall under both hooks." in out and "checksum did" not in out


def test_explain_hook_race_says_when_the_bug_happened_to_pass(capsys):
    races.explain_hook_race({"chained": _hook("chained"), "unchained": _hook("unchained")})
    assert "happened to be right on every step" in capsys.readouterr().out


def test_explain_hook_race_asserts_the_chained_hook_was_right():
    with pytest.raises(AssertionError):
        races.explain_hook_race({"chained": _hook("chained", wrong=1),
                                 "unchained": _hook("unchained", 80, 20)})


def test_explain_async_races_accounts_for_every_edited_element(capsys):
    ar = _async()
    ar["variants"]["edit_before_wait"]["wrong_elements"] = 0.994
    races.explain_async_races(ar, _async())
    out = capsys.readouterr().out
    # 410 73.7% + 210/310 25.0% + 10 0.0% + right 0.6% + else 0.7% = 100%
    assert ("73.7% 410 (every rank's edit), 25.0% 210 or 310 (some ranks' edits), 0.6% 110 "
            "(right by chance), 0.7% anything else.") in out
