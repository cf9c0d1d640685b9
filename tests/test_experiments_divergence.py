"""Notebook 08's newer claims, on real clusters: where rounding splits replicas and where it
does not, and loops that stop learning while their gradients and replicas look normal."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab.experiments import divergence as D

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_other_rounding_before_the_all_reduce_changes_the_value_not_the_agreement():
    runs = D.train(["manual_allreduce", "split_batch_before", "float64_update"], steps=4,
                   world=3, timeout=60)
    ref, split, f64 = runs["manual_allreduce"], runs["split_batch_before"], runs["float64_update"]
    assert np.all(ref["distance"] == 0) and np.all(split["distance"] == 0)
    assert D.replicas_agree(split) == []
    assert 0 < D.run_distance(split, ref) < 1e-4  # every rank received the same other bytes
    assert D.run_distance(ref, ref) == 0
    assert D.replicas_agree(f64) == [2]  # rank-local rounding after the sync splits rank 2


def test_a_detached_optimizer_and_a_divided_learning_rate_stall_without_any_alarm():
    world, batch, steps = 3, 8, 6
    runs = D.train(["healthy", "optimizer_detached", "lr_divided"], steps=steps, world=world,
                   batch=batch, monitor_every=2, monitor_options=D.SYNC_ONLY, timeout=60)
    ok, detached, divided = runs["healthy"], runs["optimizer_detached"], runs["lr_divided"]
    for run in runs.values():
        assert run["grad_norm"].shape == run["update_ratio"].shape == (steps, world)
        assert run["params"].shape[0] == world
        assert run["alerts"] == [] and np.all(run["distance"] == 0)
        assert np.all(np.isfinite(run["grad_norm"])) and np.all(run["grad_norm"] > 0)
    # Nothing is applied: no update, a constant evaluation loss and checksum.
    assert np.all(detached["update_ratio"] == 0)
    assert np.ptp(detached["eval_loss"]) == 0
    assert np.all(detached["fingerprint"] == detached["fingerprint"][0])
    # From the same weights and batch, the divided rate's first update is 1/(W x batch).
    np.testing.assert_allclose(divided["update_ratio"][0] / ok["update_ratio"][0],
                               1 / (world * batch), rtol=1e-3)
    np.testing.assert_allclose(divided["grad_norm"][0], ok["grad_norm"][0], rtol=1e-6)
    assert np.all(ok["update_ratio"] > 0)
    # The learning rate SGD actually applied, ||update|| / ||gradient||, against the configured
    # one: exactly lr when healthy, lr / (W x batch) when divided, 0 when detached.
    lr = 0.05
    np.testing.assert_allclose(ok["update_norm"] / ok["grad_norm"], lr, rtol=1e-4)
    np.testing.assert_allclose(divided["update_norm"] / divided["grad_norm"],
                               lr / (world * batch), rtol=1e-3)
    assert np.all(detached["update_norm"] == 0)
    assert ok["eval_loss"][-1, 0] < divided["eval_loss"][-1, 0] < detached["eval_loss"][-1, 0]



def test_hidden_saturation_finds_a_huge_first_layer_weight_and_its_dead_tanh():
    import torch

    model = D.build_model()
    with torch.no_grad():
        model[0].weight[3, 5] = 1e30  # unit 3, input 5
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    sat = D.hidden_saturation({"params": flat.numpy()[None, :]})
    assert (sat["unit"], sat["input"]) == (3, 5)
    assert sat["zero_grad_share"] == 1.0 and sat["min_abs_z"] > 1e20
    healthy = D.hidden_saturation({"params": flat.numpy()[None, :] * 0})
    assert healthy["zero_grad_share"] == 0.0


def test_a_layer_recreated_after_wrapping_raises_or_drifts_silently():
    strict = D.recreated_layer(False, steps=3, timeout=60)
    assert strict["step"] == 1 and "Expected to have finished reduction" in strict["message"]
    lenient = D.recreated_layer(True, steps=3, timeout=60)
    assert lenient["step"] is None
    assert lenient["first_gap"] == 0 and lenient["last_gap"] > 0  # only the new layer drifts
