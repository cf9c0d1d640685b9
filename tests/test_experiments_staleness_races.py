"""Experiments of notebooks 05 (stragglers, staleness), 06 (async collectives) and 06b
(lock-free updates): the claims they assert.

Real processes on a shared 2-core machine: tolerances are relative and generous, and no test
asserts an absolute time.
"""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab import models
from clusterlab.experiments import async_races, races, staleness

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftovers")]






# --- delayed gradient descent: deterministic ------------------------------------------------


@pytest.mark.parametrize("tau", range(11))
def test_stability_boundary_matches_the_closed_form(tau):
    assert abs(staleness.stability_boundary(tau) - models.delayed_gd_stable_step(tau)) < 1e-3


def test_delayed_gd_is_the_recurrence_and_diverges_past_the_boundary():
    x = staleness.delayed_gd(0.5, 2, 6)
    assert np.allclose(x, [1, 0.5, 0, -0.5, -0.75, -0.75, -0.5])
    limit = models.delayed_gd_stable_step(3)
    assert abs(staleness.delayed_gd(0.9 * limit, 3, 3000)[-1]) < 1e-3
    assert abs(staleness.delayed_gd(1.1 * limit, 3, 3000)[-1]) > 1e3
    assert staleness.growth_rate(0.9 * limit, 3) < 0 < staleness.growth_rate(1.1 * limit, 3)


def test_compute_draws_are_seeded_per_rank():
    a = staleness.compute_draws(4, 10, 0.01, 0.02, seed=3)
    b = staleness.compute_draws(8, 10, 0.01, 0.02, seed=3)
    assert np.array_equal(a, b[:, :4]) and (a >= 0.01).all()
    slow = staleness.compute_draws(4, 10, 0.01, 0.0, slow_rank=2, slowdown=3.0)
    assert np.allclose(slow[:, 2], 0.03) and np.allclose(slow[:, 0], 0.01)


def test_backup_prediction_is_the_order_statistic():
    assert staleness.backup_step_prediction(8, 0, 0.1, 0.02) == pytest.approx(
        models.straggler_step(0.1, 0.02, 8))
    h = sum(1 / i for i in range(3, 9))
    assert staleness.backup_step_prediction(8, 2, 0.0, 1.0) == pytest.approx(h)


def test_simulated_steps_follow_c_plus_m_h_n():
    sim = staleness.simulated_step_times([16, 256], 0.05, 0.01, steps=4000)
    assert np.allclose(sim["mean_step_s"], sim["model_s"], rtol=0.03)


# --- real clusters ---------------------------------------------------------------------------


def test_straggler_mean_step_follows_c_plus_m_h_n():
    c, m = 0.02, 0.02
    r = staleness.synchronous_step_times(4, c, exp_mean_s=m, steps=30, seed=0)
    model = models.straggler_step(c, m, 4)
    # consistency check (not the barrier): each step's slowest seeded sleep has the mean of
    # the order statistic
    assert abs(r["mean_slowest_s"] - model) / model < 0.15
    # the step is that wait plus the collective, never less
    assert r["mean_step_s"] >= 0.97 * r["mean_slowest_s"]
    assert r["mean_step_s"] > c + m  # slower than any one rank on average


def test_backup_workers_shorten_the_step():
    out = staleness.backup_workers(6, [0, 2], compute_s=0.01, exp_mean_s=0.02, steps=20)
    full, backup = out
    assert backup["mean_step_s"] < full["mean_step_s"]
    assert backup["cancelled"] > 0 and full["cancelled"] == 0


def test_async_ps_measures_staleness_and_the_step_size_fix_helps():
    from clusterlab import Cluster

    with Cluster(nodes=5, nic="delay 100us") as cl:
        plain = staleness.async_parameter_server(4, 150, lr=0.7, cluster=cl)
        fixed = staleness.async_parameter_server(4, 150, lr=0.7, fix="scale", cluster=cl)
    assert plain["tau"].mean() > 1 and plain["tau"].max() >= 2
    assert plain["step_back"] > 0
    assert fixed["final_loss"] < plain["final_loss"]
    # plain async hands each version to one worker: nothing is released together
    assert np.array_equal(plain["version"], np.arange(150) - plain["tau"].astype(int))
    assert staleness.shared_versions(plain)["shared"] == 0


def test_plain_async_mean_staleness_is_w_minus_1_whatever_the_speeds():
    from clusterlab import Cluster

    # every applied update makes each of the other W - 1 gradients in flight one version
    # older: sum(τ) + what is still in flight = (W - 1)·U exactly, slow worker or not
    with Cluster(nodes=5, nic="delay 100us") as cl:
        runs = [staleness.async_parameter_server(4, 100, lr=0.3, cluster=cl, **kw)
                for kw in ({}, {"slow_worker": 3, "slowdown": 4.0, "fix": "scale"})]
    for r in runs:
        assert r["tau"].sum() + staleness.in_flight_staleness(r) == 3 * 100
    with pytest.raises(ValueError, match="SSP"):
        staleness.in_flight_staleness({**runs[0], "fix": "ssp"})


def test_ssp_releases_blocked_workers_together_and_their_steps_add_up():
    from clusterlab import Cluster

    with Cluster(nodes=5, nic="delay 100us") as cl:
        kw = dict(fix="ssp", bound=1, slow_worker=3, slowdown=4.0, cluster=cl)
        runs = {a: staleness.async_parameter_server(4, 150, lr=a, **kw) for a in (0.45, 0.55)}
    g = staleness.shared_versions(runs[0.45])
    assert g["typical"] == 4 and g["in_shared"] > 0.8  # all four pull one version
    # four gradients of one version are one step of 4a: stable iff 4a < 2, whatever τ
    assert runs[0.45]["final_loss"] < runs[0.45]["initial_loss"] < runs[0.55]["final_loss"]


def test_shared_versions_counts_gradients_of_one_version():
    g = staleness.shared_versions({"version": np.array([0, 0, 1, 2, 2, 2, 3, 5, 5])})
    assert list(g["sizes"]) == [1, 3, 1, 2] and g["shared"] == 2 and g["typical"] == 2
    assert g["in_shared"] == pytest.approx(5 / 7) and g["largest"] == 3
    with pytest.raises(ValueError, match="beyond the starting version"):
        staleness.shared_versions({"version": np.zeros(3)})


def test_hogwild_loses_updates_without_a_lock_and_not_with_one():
    problem = races.make_problem("dense")
    free = races.hogwild(problem, workers=4, updates=2000, lr=0.05, mode="none")
    locked = races.hogwild(problem, workers=4, updates=2000, lr=0.05, mode="lock")
    assert free["lost"] > 0
    assert free["overwrote_one"] + free["rollbacks"] > 0  # the write-backs that lost them
    assert locked["lost"] == 0 and locked["mixed_reads"] == 0
    assert locked["overwrote_one"] == locked["rollbacks"] == 0
    assert locked["counted"] == locked["expected"] == 4 * 2000 * problem.dim
    seq = races.hogwild(problem, workers=4, updates=1000, lr=0.05, mode="seqlock")
    assert seq["lost"] == 0


def test_in_place_adds_lose_far_fewer_updates_than_write_backs():
    problem = races.make_problem("dense")
    back = races.hogwild(problem, workers=4, updates=2000, lr=0.05, mode="none")
    inplace = races.hogwild(problem, workers=4, updates=2000, lr=0.05, mode="inplace")
    # a write-back erases what landed since its read; an in-place add only races per element
    assert inplace["lost"] * 20 < back["lost"]
    assert inplace["overwrote_one"] == inplace["rollbacks"] == 0 and inplace["age_mean"] >= 0
    assert inplace["final_loss"] < inplace["initial_loss"]
    for r in (back, inplace):  # context switches are counted per worker (getrusage)
        assert r["switches_involuntary"] >= 0 and r["switches_voluntary"] >= 0


def test_loss_samples_carry_the_update_count_and_the_bookkeeping_is_the_same_in_every_mode():
    problem = races.make_problem("dense")
    locked = races.hogwild(problem, workers=2, updates=3000, lr=0.05, mode="lock",
                           sample_every_s=0.001)
    before, after = locked["curve_updates"], locked["curve_updates_after"]
    assert before[0] == 0 and before[-1] == after[-1] == locked["updates"]
    assert np.all(np.diff(before) >= 0) and np.all(before <= after)
    assert len(set(before.tolist())) > 3  # counted every update, not every 256
    # every mode measures the age of its read; under the lock nothing lands meanwhile
    assert locked["age_mean"] == 0


def test_writeback_model_loses_up_to_all_but_one_in_w_without_any_pause():
    assert races.writeback_model(workers=1, window=0.9)["lost_fraction"] == 0
    for w in (2, 4):
        lost = [races.writeback_model(workers=w, window=f)["lost_fraction"]
                for f in (0.1, 0.5, 0.9)]
        bound = (w - 1) / w
        assert lost[0] < lost[1] < lost[2] <= bound + 1e-9  # longer windows erase more
        assert lost[2] > bound - 0.02  # a window of most of a loop: about (W - 1)/W
    with pytest.raises(ValueError):
        races.writeback_model(workers=2, window=0)


def test_sync_allreduce_has_no_lost_updates_and_identical_replicas():
    r = races.sync_allreduce("sparse", workers=2, updates=256, batch=32)
    assert r["lost"] == 0 and r["replicas_agree"]
    assert r["examples"] == 2 * 256 and r["steps"] == 256 // 32  # one update per step
    assert r["final_loss"] < r["initial_loss"]


def test_hogwild_times_itself_and_a_lock_serialises_the_workers():
    problem = races.make_problem("dense")
    locked = races.hogwild(problem, workers=2, updates=1500, lr=0.05, mode="lock")
    assert locked["elapsed_s"] > 0 and locked["cpu_s"] > 0
    assert locked["updates_per_s"] == pytest.approx(locked["updates"] / locked["elapsed_s"])
    # one worker at a time holds the lock for the whole update: at most about one CPU busy
    assert locked["parallelism"] < 1.3


def test_throughput_rate_is_parallelism_over_cpu_per_update():
    out = races.throughput("sparse", workers=(1, 2), modes=("none", "lock"), total_updates=1000,
                           repeats=2)
    assert out["workers"] == [1, 2] and out["cores"] >= 1
    for m in ("none", "lock"):
        assert all(len(v) == 2 for v in out["rate"][m])
        for rate, par, cpu_us in out["median_run"][m]:
            assert rate == pytest.approx(par / (1e-6 * cpu_us), rel=1e-9)
    # useful updates/s discount the erased ones; a lock erases none
    assert out["useful_median"]["lock"] == out["median"]["lock"]
    assert all(len(v) == 2 for v in out["lost_fraction"]["none"])


def test_touching_a_buffer_before_wait_goes_wrong_and_the_fixes_do_not():
    out = async_races.async_collective_races(workers=2, trials=6, numel=1 << 17, timeout=60)
    v = out["variants"]
    assert set(v) == set(async_races.ASYNC_VARIANTS)
    assert all(d["reads"] == 2 * 6 for d in v.values())
    # the race is a race: it need not hit every time, but over 12 reads of a 512 KiB
    # all-reduce issued a few microseconds earlier it hits at least once
    assert v["read_before_wait"]["wrong_trials"] > 0
    assert v["edit_before_wait"]["wrong_trials"] > 0
    e = v["edit_before_wait"]  # the outcomes counted apart never exceed the wrong elements
    assert e["edit_sent"] + e["edit_lost"] + e["edit_partly"] <= e["wrong_elements"] + 1e-12
    for n in ("wait_then_read", "wait_then_edit"):
        assert v[n]["wrong_trials"] == 0 and v[n]["wrong_elements"] == 0, n
        assert v[n]["disagree_trials"] == 0, n


def test_replica_digests_are_the_same_in_every_interpreter():
    # Ranks started by "spawn" (Cluster's default on macOS and Windows) are fresh interpreters,
    # each with its own salt for hash(): the digest that compares the ranks' bytes must not
    # depend on it, or identical replicas would be counted as disagreeing.
    import os
    import subprocess
    import sys

    code = ("import numpy as np; from clusterlab.experiments.async_races import _digest; "
            "print(_digest(np.arange(1000, dtype=np.float32)))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    seen = {subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True, timeout=120).stdout.strip() for _ in range(2)}
    assert seen == {async_races._digest(np.arange(1000, dtype=np.float32))}
    assert async_races._digest(np.zeros(4, np.float32)) != async_races._digest(
        np.ones(4, np.float32))


def test_a_ddp_hook_must_chain_on_its_collective():
    from clusterlab import Cluster

    with Cluster(nodes=2, nic=None, timeout=60) as cl:
        ok, bad = (async_races.ddp_hook_race(h, workers=2, steps=4, cluster=cl)
                   for h in ("chained", "unchained"))
    # the chained hook gives DDP the true average at every step and the replicas stay equal
    assert ok["wrong_steps"] == 0 and ok["differ_steps"] == 0 and ok["max_error"] < 1e-5
    assert ok["loss_last"] < ok["loss_first"]
    # the unchained one hands DDP the bucket before the all-reduce has reduced it: DDP's copy
    # happens microseconds after the launch, a Gloo all-reduce takes far longer
    assert bad["wrong_steps"] > 0 and bad["differ_steps"] > 0 and bad["unreduced"] > 0.5


def _bare_future_hook_rank():
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(torch.nn.Linear(4, 4))
    ddp.register_comm_hook(
        None, lambda state, bucket: dist.all_reduce(bucket.buffer(), async_op=True).get_future())
    try:
        ddp(torch.randn(2, 4)).sum().backward()
    except RuntimeError as e:
        return str(e)
    return "accepted"


def test_ddp_rejects_a_hook_that_returns_the_bare_collective_future():
    # What notebook 06 says of the fix: the collective's own future holds a list of tensors,
    # DDP takes a future of one tensor, so the hook must return a .then() that unwraps it.
    from clusterlab.experiments.common import use_or_open

    with use_or_open(None, ddp=True, nodes=2, nic=None, timeout=60) as cl:
        said = cl.run(_bare_future_hook_rank)
    assert all("PyObject" in s for s in said), said


def test_ddp_hook_race_refuses_bad_input_before_starting_anything():
    with pytest.raises(ValueError, match="hook must be one of"):
        async_races.ddp_hook_race("maybe")
    with pytest.raises(ValueError, match="workers >= 2"):
        async_races.ddp_hook_race("chained", workers=1)


def test_repeat_runs_reuse_a_run_made_with_the_same_settings():
    dense = races.make_problem("dense")
    first = races.hogwild(dense, workers=2, updates=50, lr=0.05, mode="writeback", seed=0)
    reuse = {("dense", "writeback"): first}
    rep = races.repeat_runs(dense, modes=("writeback",), workers=(2,), total_updates=100,
                            lr=0.05, repeats=2, reuse=reuse)
    assert rep["writeback", 2][0] is first and rep["writeback", 2][1]["seed"] == 1
    # another lr (or worker count) is another setting: the run is made anew
    other = races.repeat_runs(dense, modes=("writeback",), workers=(2,), total_updates=100,
                              lr=0.1, repeats=1, reuse=reuse)
    assert other["writeback", 2][0] is not first and other["writeback", 2][0]["lr"] == 0.1
