"""Lab 06 (races): plausible wrong answers, each rejected with the sentence that teaches.

The workers are real processes on shared memory; the checks' verdicts that these tests rely
on are either deterministic (the one-worker probe stages its races on purpose) or about
events that are certain in practice (a dense lock-free run loses most of its updates), and
no test asserts a time.
"""

from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import pytest

from clusterlab.labs import _answers as answers
from clusterlab.labs import races as lab
from clusterlab.labs import run_checks

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftovers")]


@pytest.fixture(autouse=True)
def quick_stall(monkeypatch):
    """Deadlocks are declared after 1.5 s without progress here (4 s in the lab): the
    wrong answers that deadlock do so at their first or second update."""
    monkeypatch.setattr(lab, "STALL_S", 1.5)


def outcomes(exercise: str, name: str, fn, *, hidden: bool = False) -> dict:
    """Each check's outcome, by the first two words of its name ("one worker", "4 workers")."""
    report = run_checks(exercise, {name: fn}, hidden=hidden)
    return {" ".join(o.check.split()[:2]).rstrip(":,"): o for o in report.outcomes}


def assert_fails(o, *phrases: str) -> None:
    assert o.status == "fail", (o.status, o.message)
    for phrase in phrases:
        assert phrase in o.message, (phrase, o.message)


# --- wrong answers -------------------------------------------------------------------------------


def hogwild_with_lock(p, idx, step):  # step 1 made safe already: nothing to count
    with p.lock:
        xv = p.x[idx]
        p.x[idx] = xv + step(xv)


def hogwild_subtracts(p, idx, step):
    xv = p.x[idx]
    p.x[idx] = xv - step(xv)


def hogwild_on_a_copy(p, idx, step):  # p.x[idx] is a copy: the update goes nowhere
    xv = p.x[idx]
    xv += step(xv)


def hogwild_steps_twice(p, idx, step):
    xv = p.x[idx]
    step(xv)
    p.x[idx] = xv + step(xv)


def no_lock(p, idx, step):
    xv = p.x[idx]
    p.x[idx] = xv + step(xv)


def lock_around_the_write(p, idx, step):
    xv = p.x[idx]
    d = step(xv)
    with p.lock:
        p.x[idx] = xv + d


def lock_never_released(p, idx, step):
    p.lock.acquire()
    xv = p.x[idx]
    p.x[idx] = xv + step(xv)


def lock_of_my_own(p, idx, step):  # a new lock in every call: excludes nobody
    with multiprocessing.Lock():
        xv = p.x[idx]
        p.x[idx] = xv + step(xv)


_THREAD_LOCK = threading.Lock()  # copied, not shared, into every forked worker


def lock_per_worker(p, idx, step):
    with _THREAD_LOCK:
        xv = p.x[idx]
        p.x[idx] = xv + step(xv)


def seqlock_no_recheck(p, idx, step):
    while True:
        v = p.seq[0]
        if v % 2 == 0:
            break
    xv = p.x[idx]  # ... and never looks at p.seq again
    d = step(xv)
    with p.lock:
        p.seq[0] += 1
        p.x[idx] += d
        p.seq[0] += 1


def seqlock_ignores_odd(p, idx, step):
    while True:
        v = p.seq[0]
        xv = p.x[idx]
        if p.seq[0] == v:
            break
    d = step(xv)
    with p.lock:
        p.seq[0] += 1
        p.x[idx] += d
        p.seq[0] += 1


def _seq_read(p, idx):
    while True:
        v = p.seq[0]
        if v % 2:
            continue
        xv = p.x[idx]
        if p.seq[0] == v:
            return xv


def seqlock_never_odd(p, idx, step):  # the version moves only after the write
    d = step(_seq_read(p, idx))
    with p.lock:
        p.x[idx] += d
        p.seq[0] += 2


def seqlock_left_odd(p, idx, step):
    d = step(_seq_read(p, idx))
    with p.lock:
        p.seq[0] += 1
        p.x[idx] += d


def seqlock_writes_the_snapshot(p, idx, step):  # overwrites writes that came in between
    xv = _seq_read(p, idx)
    d = step(xv)
    with p.lock:
        p.seq[0] += 1
        p.x[idx] = xv + d
        p.seq[0] += 1


def seqlock_locks_everything(p, idx, step):
    with p.lock:
        xv = p.x[idx]
        d = step(xv)
        p.seq[0] += 1
        p.x[idx] = xv + d
        p.seq[0] += 1


def seqlock_unlocked_writer(p, idx, step):
    d = step(_seq_read(p, idx))
    p.seq[0] += 1
    p.x[idx] += d
    p.seq[0] += 1


def seqlock_bump_after_release(p, idx, step):
    """Probe item 8: the second bump after `with p.lock:` ends. Caught by the 4-worker run
    only when two writers' unlocked bumps collided (2 runs in 19)."""
    d = step(_seq_read(p, idx))
    with p.lock:
        p.seq[0] += 1
        p.x[idx] += d
    p.seq[0] += 1


def seqlock_keeps_the_copy_it_waited_with(p, idx, step):
    """Reads first, waits out a write in progress, then steps from the old (torn) copy."""
    xv = p.x[idx]
    while p.seq[0] % 2:
        os.sched_yield()
    d = step(xv)
    with p.lock:
        p.seq[0] += 1
        p.x[idx] += d
        p.seq[0] += 1


def crashes(p, idx, step):
    raise ValueError("boom")


def spins_forever(p, idx, step):
    while True:
        pass


def price_batched(run_safe, run_unsafe, repeats=5):
    unsafe = [run_unsafe() for _ in range(repeats)]
    safe = [run_safe() for _ in range(repeats)]
    samples = [s / u for s, u in zip(safe, unsafe)]
    return {"ratio": float(np.median(samples)), "samples": samples}


def price_mean(run_safe, run_unsafe, repeats=5):
    samples = []
    for _ in range(repeats):
        u = run_unsafe()
        samples.append(run_safe() / u)
    return {"ratio": float(np.mean(samples)), "samples": samples}


def price_inverted(run_safe, run_unsafe, repeats=5):
    samples = []
    for _ in range(repeats):
        u = run_unsafe()
        samples.append(u / run_safe())
    return {"ratio": float(np.median(samples)), "samples": samples}


def todo(*args, **kwargs):
    raise NotImplementedError("your code here")


# --- the references pass everything -----------------------------------------------------------


@pytest.mark.parametrize("exercise,name,fn", [
    ("race_hogwild", "hogwild_update", answers.reference_hogwild),
    ("race_lock", "locked_update", answers.reference_locked),
    ("race_seqlock", "seqlock_update", answers.reference_seqlock),
    ("race_price", "price", answers.reference_price),
])
def test_the_reference_passes_visible_checks(exercise, name, fn):
    # The hidden checks of the solved notebook run under nbval (test.sh, strict): here the
    # reference only has to pass what the wrong answers below are compared against.
    report = run_checks(exercise, {name: fn}, hidden=False)
    assert all(o.status in ("pass", "skip") for o in report.outcomes), report.text()


@pytest.mark.parametrize("exercise,name", [
    ("race_hogwild", "hogwild_update"), ("race_lock", "locked_update"),
    ("race_seqlock", "seqlock_update"), ("race_price", "price")])
def test_an_unwritten_answer_is_todo_not_a_failure(exercise, name):
    report = run_checks(exercise, {name: todo}, hidden=True)
    assert {o.status for o in report.outcomes} == {"todo"}, report.text()


# --- step 1 ---------------------------------------------------------------------------------------


def test_a_locked_step_1_has_nothing_to_count():
    assert_fails(outcomes("race_hogwild", "hogwild_update", hogwild_with_lock)["4 workers"],
                 "no update was lost", "acquired p.lock", "naive update, with no lock")


@pytest.mark.parametrize("fn,phrase", [
    (hogwild_subtracts, "subtracted the step"),
    (hogwild_on_a_copy, "is a copy"),
    (hogwild_steps_twice, "called step() 2 times"),
])
def test_a_wrong_single_update_is_named(fn, phrase):
    assert_fails(outcomes("race_hogwild", "hogwild_update", fn)["one worker"], phrase)


# --- step 2 ---------------------------------------------------------------------------------------


def test_no_lock_at_all_loses_updates_and_says_how_many():
    o = outcomes("race_lock", "locked_update", no_lock)["4 workers"]
    assert_fails(o, "coordinate increments lost", "p.lock was never acquired")
    lost = int(o.message.split(" of ")[0])
    assert lost > 0


def test_a_lock_around_the_write_alone_still_loses_updates():
    out = outcomes("race_lock", "locked_update", lock_around_the_write)
    assert_fails(out["4 workers"], "increments lost", "step() ran outside it",
                 "whole read-modify-write")
    assert_fails(out["one worker"], "ONE critical section")


def test_a_lock_never_released_times_out_naming_the_workers():
    out = outcomes("race_lock", "locked_update", lock_never_released)
    assert_fails(out["4 workers"], "timed out", "no update finished for 1.5 s", "Worker ",
                 "holds p.lock (acquired it 1 time, released it 0 times)", "waiting to acquire it",
                 "`with p.lock:`")
    assert_fails(out["one worker"], "returned still holding p.lock")


@pytest.mark.parametrize("fn", [lock_of_my_own, lock_per_worker])
def test_a_lock_that_is_not_shared_still_races(fn):
    assert_fails(outcomes("race_lock", "locked_update", fn)["4 workers"],
                 "increments lost", "p.lock was never acquired", "not shared")


# --- step 3 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn,phrases", [
    (seqlock_no_recheck, ("a write ran while", "torn read", "Re-read p.seq[0] after the copy")),
    (seqlock_ignores_odd, ("while p.seq[0] was odd", "must retry")),
    (seqlock_never_odd, ("while p.seq[0] was even", "odd FIRST")),
    (seqlock_locks_everything, ("held p.lock: in a seqlock readers take no lock",)),
])
def test_a_broken_seqlock_is_caught_by_the_staged_races(fn, phrases):
    assert_fails(outcomes("race_seqlock", "seqlock_update", fn)["one worker"], *phrases)


def test_seqlock_writers_without_the_lock_are_caught():
    out = outcomes("race_seqlock", "seqlock_update", seqlock_unlocked_writer)
    assert_fails(out["one worker"], "never acquired p.lock")
    o = out["4 workers"]  # racy bumps leave the version odd (readers stall) or lose updates
    assert o.status == "fail" and ("increments lost" in o.message
                                   or "lost update of the version itself" in o.message), o.message


def test_a_seqlock_writer_that_stores_its_snapshot_loses_updates():
    assert_fails(outcomes("race_seqlock", "seqlock_update", seqlock_writes_the_snapshot)[
        "4 workers"], "increments lost", "CURRENT values")


def test_a_version_left_odd_stalls_the_readers_and_says_so():
    out = outcomes("race_seqlock", "seqlock_update", seqlock_left_odd)
    assert_fails(out["one worker"], "is odd after", "1 after")
    assert_fails(out["4 workers"], "timed out", "is odd", "retries forever")


# --- crashes and hangs ------------------------------------------------------------------------


def test_an_update_that_raises_is_named_and_leaves_nothing_behind():
    out = outcomes("race_lock", "locked_update", crashes)
    assert_fails(out["one worker"], "worker 0 raised ValueError: boom")
    assert_fails(out["4 workers"], "raised ValueError: boom")


def test_an_update_that_never_returns_times_out():
    out = outcomes("race_hogwild", "hogwild_update", spins_forever)
    assert_fails(out["one worker"], "timed out with one worker", "loop forever")


# --- step 4 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn,phrase", [
    (price_batched, "Interleave them"),
    (price_mean, "that is their mean"),
    (price_inverted, "unsafe / safe"),
])
def test_a_wrong_price_is_named(fn, phrase):
    assert_fails(outcomes("race_price", "price", fn)["5 pairs"], phrase)


# --- the harness itself ---------------------------------------------------------------------------


def test_runs_are_counted_exactly_and_leave_no_shared_memory_behind():
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    r = lab.run_workers(answers.reference_locked, workers=3, updates=300, kind="sparse", seed=5)
    assert r["exact"] and r["lost"] == 0 and r["acquires"] == r["releases"] == 900
    assert r["steps"] == 900 and r["locked_steps"] == 900 and r["overlaps"] == 0
    free = lab.run_workers(answers.reference_hogwild, workers=3, updates=300, dim=512, work=0)
    assert free["expected"] == 3 * 300 * 512 and free["lost"] >= 0
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) <= shm


def test_probe_a_seqlock_bump_outside_the_lock_is_caught_every_time():
    for _ in range(3):  # staged in the one-worker probe: no luck involved
        report = run_checks("race_seqlock", {"seqlock_update": seqlock_bump_after_release},
                            only="one worker, and staged races: a write in progress, a write "
                                 "during the read")
        (o,) = report.outcomes
        assert_fails(o, "changed p.seq[0] 1 time(s) without holding p.lock",
                     "Both bumps belong inside")


def test_probe_a_stale_copy_message_shows_the_values_that_differ():
    report = run_checks("race_seqlock", {"seqlock_update": seqlock_keeps_the_copy_it_waited_with},
                        only="one worker, and staged races: a write in progress, a write "
                             "during the read")
    (o,) = report.outcomes
    assert_fails(o, "values differ; the first at position", "read p.x[idx] again")
