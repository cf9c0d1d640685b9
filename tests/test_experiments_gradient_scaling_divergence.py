"""Gradient scaling (notebook 07) and silent divergence (notebook 08), on real clusters.

Every claim the notebooks make is checked here on the experiment functions themselves:
numbers against a single-process reference, failures as named errors (never a hang), and no
rank process left behind.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import psutil
import pytest

from clusterlab.experiments import divergence as D
from clusterlab.experiments import gradient_scaling as S

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every cluster an experiment starts is gone when it returns."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    mp.active_children()  # reap what has ended
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"rank processes left behind: {left}"


# --- notebook 07 -------------------------------------------------------------------------------


def test_uneven_batches_mean_of_means_is_wrong_and_the_global_count_fixes_it():
    r = S.uneven_batches(batch_sizes=(8, 16, 32, 64), steps=5)
    ref = S.full_batch_gradient(120)
    np.testing.assert_array_equal(r["reference"], ref)
    # DDP with mean losses computes exactly the mean of the per-shard mean gradients...
    assert S.relative_error(r["grad"]["mean_of_means"], r["predicted_mean_of_means"]) < 1e-12
    # ...which is far from the full-batch gradient,
    assert r["rel_error"]["mean_of_means"] > 1e-2
    # while dividing by the global count (or weighting by n_r / N) is exact in float64.
    for m in ("global_count", "weighted"):
        assert r["rel_error"][m] < 1e-6, (m, r["rel_error"][m])
        assert r["ranks_agree"][m]
        assert r["param_error"][m][-1] < 1e-10
    assert r["param_error"]["mean_of_means"][-1] > 1e-4
    assert r["sample_weight"]["mean_of_means"][0] == pytest.approx(120 / (4 * 8))


def test_uneven_batches_is_deterministic():
    a = S.uneven_batches(batch_sizes=(4, 12), steps=2)
    b = S.uneven_batches(batch_sizes=(4, 12), steps=2)
    for m in S.METHODS:
        np.testing.assert_array_equal(a["grad"][m], b["grad"][m])


def test_sum_losses_scale_the_gradient_with_the_per_rank_batch():
    r = S.sum_vs_mean(world_sizes=(1, 2), global_batch=16, steps=2)
    mean, summed = r["grad_norm"]["mean"], r["grad_norm"]["sum"]
    assert mean[0] == pytest.approx(mean[1], rel=1e-12)
    for w, n in zip(r["world_sizes"], summed):
        assert n == pytest.approx(mean[0] * 16 / w, rel=1e-12)


def test_with_adam_sum_and_mean_losses_train_alike():
    sm = S.sum_vs_mean(world_sizes=(1, 4), steps=8, optimizer="adam")
    # The summed loss's gradient is 64/W times larger, yet Adam's steps are the same (up to eps).
    assert sm["grad_norm"]["sum"][0] > 10 * sm["grad_norm"]["mean"][0]
    for i in range(2):
        np.testing.assert_allclose(sm["loss"]["sum"][i], sm["loss"]["mean"][i], rtol=1e-6)
    assert sm["effective_lr"]["sum"] == [sm["lr"]] * 2


def test_with_adam_the_mean_of_means_is_still_biased():
    r = S.uneven_batches(batch_sizes=(3, 10, 40, 99), steps=10, optimizer="adam", lr=0.05)
    assert r["param_error"]["global_count"][-1] < 1e-10
    assert r["param_error"]["mean_of_means"][-1] > 1e-3


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        S.sum_vs_mean(optimizer="lamb")


def test_mean_of_means_minimiser_moves():
    m = S.minimisers(batch_sizes=(3, 10, 40, 99))
    assert 1e-3 < m["shift"] < 0.1 * m["scale"]
    assert m["excess_loss"] > 0 and m["min_loss"] > 0
    same = S.minimisers(batch_sizes=(40, 40))  # equal shards: the same objective
    assert same["shift"] < 1e-12


def test_clipping_by_the_global_norm_matches_one_process_and_local_does_not():
    c = S.clipping(world=4, features=8, steps=3)
    assert c["global"]["rel_error"] < 1e-12 and c["global"]["param_error"][-1] < 1e-12
    assert np.ptp(c["global"]["block_scale"]) < 1e-12  # one factor for every block
    assert c["local"]["cosine"] < 0.99  # each block its own factor: another direction
    assert np.ptp(c["local"]["block_scale"]) > 0.01
    with pytest.raises(ValueError, match="blocks"):
        S.clipping(world=4, features=10)


def test_grad_scaler_skips_consistently_only_when_the_inf_is_shared():
    r = S.loss_scaling(steps=4, inf_step=1, inf_rank=2)
    for case in ("ddp", "sharded_synced"):
        assert r[case]["skipped"][1].all() and not r[case]["skipped"][[0, 2, 3]].any(), case
        assert (r[case]["scale"][-1] == r[case]["scale"][-1, 0]).all()
    local = r["sharded_local"]
    assert local["skipped"][1].tolist() == [False, False, True, False]
    assert local["scale"][-1, 2] == local["scale"][-1, 0] / 2  # the scales now disagree
    # every rank holds the same (all-gathered) parameters, but they differ from a synced run
    assert np.abs(local["params"][-1] - r["sharded_synced"]["params"][-1]).max() > 1e-3
    with pytest.raises(ValueError, match="shards"):
        S.loss_scaling(features=8)


def test_accumulation_without_division_gives_k_times_the_gradient():
    r = S.accumulation(ks=(1, 4), micro_batch=4)
    assert r["ratio"] == pytest.approx([1.0, 4.0], rel=1e-12)
    assert max(r["rel_error_no_division"]) < 1e-12
    assert max(r["rel_error_divided"]) < 1e-12


def test_token_accumulation_needs_the_global_token_count():
    r = S.token_accumulation(kept=((10, 90), (40, 25)))
    assert r["total"] == 165
    assert r["rel_error"]["global_tokens"] < 1e-12
    assert r["rel_error"]["mean_over_k"] > 0.05
    # equal counts everywhere: the per-micro-batch mean / k is exact too
    same = S.token_accumulation(kept=((20, 20), (20, 20)))
    assert same["rel_error"]["mean_over_k"] < 1e-12


def test_no_sync_misuse_makes_replicas_drift():
    r = S.no_sync_misuse(steps=4, k=2, world=2)
    assert np.all(r["correct"]["divergence"] == 0)
    assert r["step_inside_no_sync"]["divergence"][-1] > 0
    assert r["no_final_sync"]["divergence"][-1] > 0


def test_join_completes_where_uneven_inputs_hang():
    hang = S.uneven_inputs(batches=(3, 3, 1), use_join=False, timeout=4.0)
    assert not hang["completed"]
    assert hang["error"] == "ClusterTimeout"
    assert hang["ranks"] == [0, 1]  # the ranks still waiting for the one that left
    ok = S.uneven_inputs(batches=(3, 3, 1), use_join=True, timeout=20)
    assert ok["completed"] and ok["steps"] == [3, 3, 1] and ok["replicas_agree"]
    # They agree at the end only through Join's exit broadcast: rank 2 stopped after step 1.
    assert ok["gap_before_exit"][1] == 0 and ok["gap_before_exit"][2] > 0
    # After rank 2 joined, DDP still divides by the initial world size: 2/3 of the mean.
    np.testing.assert_allclose(ok["grad_scale"], [1.0, 2 / 3, 2 / 3], rtol=1e-9)


# --- notebook 08 ---------------------------------------------------------------------------------


def test_bit_flip_after_the_all_reduce_splits_off_one_replica():
    flip = dict(corruption="bitflip", bit=22, rank=1, step=2)
    runs = D.train([D.Fault("grad_after", **flip), D.Fault("grad_before", **flip)],
                   steps=5, world=3)
    after, before = runs["grad_after"], runs["grad_before"]
    assert D.replicas_agree(after, step=1) == []
    assert D.replicas_agree(after) == [1]  # rank 1 differs; ranks 0 and 2 agree
    assert after["distance"][-1, 1] > 0 and after["distance"][-1, 2] == 0
    assert D.replicas_agree(before) == []  # before: the sum carries it to every rank alike


def test_nan_before_the_all_reduce_reaches_every_rank_at_once():
    runs = D.train([D.Fault("grad_before", rank=2, step=1, corruption="nan"),
                    D.Fault("grad_after", rank=2, step=1, corruption="nan")], steps=3, world=3)
    assert not runs["grad_before"]["finite"][1].any()
    assert runs["grad_after"]["finite"][1].tolist() == [True, True, False]
    assert not runs["grad_after"]["finite"][2].any()  # next step: the all-reduce spreads it


def test_corrupt_flips_exactly_one_bit():
    import torch

    t = torch.tensor([1.5, 2.0])
    before, after = D.corrupt_(t, "bitflip", bit=22)
    assert (before, after) == (1.5, 1.0)
    assert t[1] == 2.0


def test_per_rank_sampler_seeds_duplicate_and_drop_samples():
    r = D.data_order(dataset_size=32, epochs=2, world=2)
    good, bad = r["shared"], r["per_rank"]
    assert good["same_order_as_previous_epoch"] == [False]  # set_epoch reshuffles
    assert good["missing"] == [0, 0] and good["duplicated"] == [0, 0]
    assert min(bad["missing"]) > 0 and min(bad["duplicated"]) > 0


@pytest.mark.parametrize("case", D.MISMATCH_CASES)
def test_mismatched_collectives_end_in_a_named_error(case):
    before = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
    r = D.mismatched_collective(case, debug="DETAIL", timeout=10)
    assert os.environ.get("TORCH_DISTRIBUTED_DEBUG") == before
    assert r["error"] == "RankError", r
    assert "Detected mismatch between collectives" in r["message"]
    assert "Rank 1 is running collective" in r["message"]
    # either rank may be the one to raise: its own collective comes first in the message
    sides = {"op": ("Op type: ALLREDUCE", "BROADCAST"), "size": ("Tensor shapes: 4", "8"),
             "smaller": ("Tensor shapes: 4", "2")}[case]
    first, other = sides
    kind, mine = first.rsplit(" ", 1)
    assert r["said"] in (f"{kind} {mine} vs {other}", f"{kind} {other} vs {mine}"), r["said"]
    assert r["wall_s"] < 10  # an error, not the timeout


def test_mismatched_collective_without_debug_is_still_bounded():
    r = D.mismatched_collective("op", debug=None, timeout=2.0)
    assert r["error"] in ("ClusterTimeout", "RankError", "RankDied")
    assert r["ranks"]


def test_a_smaller_message_lets_the_sender_return_and_the_receiver_hang():
    r = D.mismatched_collective("smaller", debug=None, timeout=2.0)
    assert r["error"] == "ClusterTimeout" and r["ranks"] == [0], r
    assert "returned already: rank 1" in r["message"]
    # the ranks start from different values, so what rank 1 holds says whose data it is
    assert r["inputs"] == {0: [1.0] * 4, 1: [2.0] * 2} and r["sum"] == 3.0
    assert r["returned"][1] != [3.0, 3.0], "rank 1 returned, but not with the sum"
    assert r["held"][1] == D.classify_held(r["returned"][1], 1, 2)
    assert r["said"] == "nothing: still waiting"
    assert r["stderr"] == {0: None, 1: None}  # neither rank printed a diagnostic


def test_a_larger_message_aborts_the_receiver_with_gloos_own_diagnostic():
    r = D.mismatched_collective("size", debug=None, timeout=2.0)
    assert r["error"] == "RankDied" and r["ranks"] == [0], r
    # Gloo's size check prints its diagnosis to rank 0's stderr before the abort (torch 2.13)
    assert D.GLOO_MISMATCH_HINT in r["stderr"][0], r["stderr"]
    assert r["said"].startswith("rank 0, Gloo: ") and r["said"].endswith("then signal SIGABRT")


def test_gloo_diagnostic_keeps_the_sentence_a_person_reads():
    log = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
           "  what():  [enforce fail at /x/gloo/transport/tcp/pair.cc:456] op.preamble.length "
           "<= op.nbytes. 8 vs 4. Received data size doesn't match expected size. Is there a "
           "distributed collective mismatch in your code?\n")
    assert D.gloo_diagnostic(log) == ("Received data size doesn't match expected size. Is "
                                      "there a distributed collective mismatch in your code?")
    assert D.gloo_diagnostic("  what():  something else\n") == "something else"
    assert D.gloo_diagnostic("") is None and D.gloo_diagnostic("a warning\n") is None


def test_classify_held_names_whose_inputs_a_rank_holds():
    # rank r's input is 2**r: 1.0 on rank 0, 2.0 on rank 1, 4.0 on rank 2
    assert [D.mismatch_input(r) for r in range(3)] == [1.0, 2.0, 4.0]
    assert D.classify_held([2.0, 2.0], 1, 2) == "its own input"
    assert D.classify_held([1.0, 1.0], 1, 2) == "rank 0's input"
    assert D.classify_held([3.0], 0, 2) == "the sum of every rank's input"
    assert D.classify_held([5.0], 1, 3) == "a partial sum of ranks 0, 2"
    assert D.classify_held([1.0, 3.0, 3.0], 1, 2) == (
        "a mix: 1 x rank 0's input; 2 x the sum of every rank's input")
    for odd in ([0.0], [2.5], [8.0], [float("nan")]):
        assert D.classify_held(odd, 1, 2) == "other values"


def test_groups_used_in_opposite_orders_deadlock():
    r = D.crossed_groups(timeout=2.0)
    assert r["error"] == "ClusterTimeout" and r["ranks"] == [0, 1], r


@pytest.mark.parametrize("debug", [None, "DETAIL"])
def test_swapped_same_shape_all_reduces_are_silent_even_with_detail(debug):
    r = D.swapped_order(debug)
    assert r["error"] is None, r["message"]
    assert r["wrong"] == [["layer_a", "layer_b"], ["layer_a", "layer_b"]]
    assert not r["ranks_agree"]


def test_a_skipped_collective_is_named_only_with_detail():
    plain = D.skipped_collective(None, wait_s=0.5)
    detail = D.skipped_collective("DETAIL", wait_s=0.5)
    # plain Gloo: the waiting ranks time out in their own send/recv, naming nobody
    assert plain["named_ranks"] == [] and all("Timed out" in m for m in plain["messages"][:2])
    # DETAIL: the wrapper's monitored barrier before the all_reduce names the absent rank
    assert detail["named_ranks"] == [2], detail["messages"]
    assert detail["messages"][2] == "" and min(detail["waits_s"][:2]) >= 0.4


def test_a_skipped_call_shifts_the_next_past_detail_and_only_the_unpaired_one_is_named(capsys):
    from clusterlab.lessons import mismatched_collectives_and_hangs as lesson

    run = D.skipped_collective("DETAIL", wait_s=0.5, then=1)
    # ranks 0 and 1: the first call met rank 2's only call and returned; the second had no
    # partner, and DETAIL's monitored barrier named rank 2
    assert run["returned"] == [1, 1, 1], run["messages"]
    assert run["named_ranks"] == [2] and run["messages"][2] == ""
    lesson.explain_shifted(run)
    assert "passed DETAIL's checks" in capsys.readouterr().out
    with pytest.raises(ValueError, match="then must be an int"):
        D.skipped_collective("DETAIL", then=-1)


def test_forgetting_set_epoch_repeats_the_order():
    o = D.data_order(epochs=2, set_epoch=False)
    assert o["shared"]["same_order_as_previous_epoch"] == [True]
    o = D.data_order(epochs=2, set_epoch=True)
    assert o["shared"]["same_order_as_previous_epoch"] == [False]


def test_monitored_barrier_names_the_missing_rank():
    r = D.missed_barrier(world=3, late_rank=2, late_s=1.0, barrier_timeout=0.3)
    assert r["named_ranks"] == [2]


def test_monitor_flags_rank_and_step_and_is_silent_when_healthy():
    faults = (D.Fault("healthy"), D.Fault("grad_after", rank=1, step=6, corruption="bitflip"))
    healthy, flipped = D.detection(faults, steps=12, every=4, world=3)
    assert healthy["alerts"] == []
    first = flipped["first"]
    assert first["kind"] == "parameter_mismatch" and first["ranks"] == [1]
    assert 6 <= first["step"] < 6 + 4
