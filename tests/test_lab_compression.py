"""Lab 10 (top-k compression hook): the reference compressor and hook pass the checks, and
typical mistakes fail the intended check with the sentence that teaches. The hook runs inside
real DDP on real ranks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from clusterlab.labs import run_checks


def topk_compress(grad, residual, ratio):
    acc = grad + residual
    k = max(1, math.ceil(ratio * acc.numel() - 1e-9))
    idx = acc.abs().topk(k).indices
    new = acc.clone()
    new[idx] = 0
    return idx, acc[idx], new


def topk_hook(state, bucket):
    buf = bucket.buffer()
    residual = state.residuals.get(bucket.index(), torch.zeros_like(buf))
    idx, vals, state.residuals[bucket.index()] = topk_compress(buf, residual, state.ratio)
    world = dist.get_world_size()
    all_idx = [torch.empty_like(idx) for _ in range(world)]
    all_vals = [torch.empty_like(vals) for _ in range(world)]
    dist.all_gather(all_idx, idx)
    dist.all_gather(all_vals, vals)
    out = torch.zeros_like(buf)
    for i, v in zip(all_idx, all_vals):
        out.index_add_(0, i, v)
    fut = torch.futures.Future()
    fut.set_result(out / world)
    return fut


def compress_residual_from_grad(grad, residual, ratio):  # e = g - sent: feedback lost
    idx, vals, _ = topk_compress(grad, residual, ratio)
    new = grad.clone()
    new[idx] -= vals
    return idx, vals, new


def compress_no_feedback(grad, residual, ratio):  # plain top-k, residual ignored
    return topk_compress(grad, torch.zeros_like(grad), ratio)


def hook_dense_no_feedback(state, bucket):  # all-reduces densely, and drops the residual
    buf = bucket.buffer()
    idx, vals, _ = topk_compress(buf, torch.zeros_like(buf), state.ratio)
    state.residuals[bucket.index()] = torch.zeros_like(buf)
    out = torch.zeros_like(buf)
    out[idx] = vals
    dist.all_reduce(out)
    fut = torch.futures.Future()
    fut.set_result(out / dist.get_world_size())
    return fut


def _one(exercise, ns, check):
    report = run_checks(exercise, ns, only=check)
    (outcome,) = [o for o in report.outcomes if o.status != "skip"]
    return outcome


def test_reference_compressor_passes_and_mistakes_are_named():
    for ex_check in ("sends the k largest |grad + residual| and keeps exactly the rest",
                     "error feedback accumulates: small entries are sent eventually"):
        assert _one("topk_compress", {"topk_compress": topk_compress}, ex_check).status == "pass"
    bad = _one("topk_compress", {"topk_compress": compress_residual_from_grad},
               "sends the k largest |grad + residual| and keeps exactly the rest")
    assert bad.status == "fail" and "drops the old residual" in bad.message, bad.message
    bad = _one("topk_compress", {"topk_compress": compress_no_feedback},
               "sends the k largest |grad + residual| and keeps exactly the rest")
    assert bad.status == "fail", bad.message
    report = run_checks("topk_compress", {"topk_compress": topk_compress}, hidden=True, seed=3)
    assert report.passed, report.text()


@pytest.mark.timeout(180)
def test_reference_hook_converges_and_a_dense_hook_without_feedback_fails(no_leftovers):
    # (every check, hidden ones included, runs on the reference in solutions/ under nbval)
    ns = {"topk_hook": topk_hook, "topk_compress": topk_compress}
    good = _one("topk_hook", ns, "converges within a bound of uncompressed DDP (ratio 5%, "
                "60 steps)")
    assert good.status == "pass", good.message
    ns = {"topk_hook": hook_dense_no_feedback, "topk_compress": topk_compress}
    bad = _one("topk_hook", ns, "bytes sent per step: k (index, value) pairs, not the dense "
               "bucket")  # the visible checks share one run per hook: this is the only one
    assert bad.status == "fail" and "dense fp32 bucket" in bad.message, bad.message
    bad = _one("topk_hook", ns, "error feedback kept in state.residuals from step to step")
    assert bad.status == "fail" and "only k = 27 were sent" in bad.message, bad.message


# --- from the labs probe (shared/reviews/labs_probe.md) -----------------------------------------


def _gather_and_average(buf, idx, vals, divide_by=None):
    world = dist.get_world_size()
    all_idx = [torch.empty_like(idx) for _ in range(world)]
    all_vals = [torch.empty_like(vals) for _ in range(world)]
    dist.all_gather(all_idx, idx)
    dist.all_gather(all_vals, vals)
    out = torch.zeros_like(buf)
    for i, v in zip(all_idx, all_vals):
        out.index_add_(0, i, v)
    fut = torch.futures.Future()
    fut.set_result(out / (divide_by or world))
    return fut


def hook_one_residual(state, bucket):
    """Probe item 11: one residual, under key 0, for every bucket."""
    buf = bucket.buffer()
    residual = state.residuals.get(0, torch.zeros_like(buf))
    idx, vals, state.residuals[0] = topk_compress(buf, residual, state.ratio)
    return _gather_and_average(buf, idx, vals)


def hook_residual_aliases_bucket(state, bucket):
    """Probe item 12: acc = grad.add_(residual), and the residual kept is that buffer, i.e.
    bucket.buffer() itself, which DDP refills before the next call."""
    grad = bucket.buffer()
    residual = state.residuals.get(bucket.index(), torch.zeros_like(grad))
    acc = grad.add_(residual)
    k = max(1, math.ceil(state.ratio * acc.numel() - 1e-9))
    idx = acc.abs().topk(k).indices
    vals = acc[idx].clone()
    acc[idx] = 0
    state.residuals[bucket.index()] = acc
    return _gather_and_average(grad, idx, vals)


def hook_divides_by_2(state, bucket):
    buf = bucket.buffer()
    residual = state.residuals.get(bucket.index(), torch.zeros_like(buf))
    idx, vals, state.residuals[bucket.index()] = topk_compress(buf, residual, state.ratio)
    return _gather_and_average(buf, idx, vals, divide_by=2)


FEEDBACK = "error feedback kept in state.residuals from step to step"


@pytest.mark.timeout(180)
def test_probe_one_residual_for_every_bucket_is_rejected(no_leftovers):
    bad = _one("topk_hook", {"topk_hook": hook_one_residual, "topk_compress": topk_compress},
               FEEDBACK)
    assert bad.status == "fail", bad.message
    assert "two buckets" in bad.message and "one residual per bucket" in bad.message, \
        bad.message


@pytest.mark.timeout(180)
def test_probe_a_residual_that_aliases_the_bucket_is_rejected(no_leftovers):
    bad = _one("topk_hook", {"topk_hook": hook_residual_aliases_bucket,
                             "topk_compress": topk_compress}, FEEDBACK)
    assert bad.status == "fail", bad.message
    assert "changed between two calls" in bad.message and "bucket.buffer()" in bad.message, \
        bad.message


@pytest.mark.timeout(180)
def test_probe_dividing_by_a_constant_is_named(no_leftovers):
    report = run_checks("topk_hook", {"topk_hook": hook_divides_by_2,
                                      "topk_compress": topk_compress}, hidden=True,
                        only="hidden: 3 ranks, other weights, other ratios")
    (o,) = report.outcomes
    assert o.status == "fail", report.text()
    assert "divided by 2 instead of the world size, 3" in o.message, o.message
    assert "index_add_" not in o.message, o.message


def hook_in_place_then_cloned(state, bucket):
    """A correct alternative: works in place on the bucket, but stores a copy as residual."""
    buf = bucket.buffer()
    buf.add_(state.residuals.get(bucket.index(), torch.zeros_like(buf)))
    k = max(1, math.ceil(state.ratio * buf.numel() - 1e-9))
    idx = buf.abs().topk(k).indices
    vals = buf[idx].clone()
    residual = buf.clone()
    residual[idx] = 0
    state.residuals[bucket.index()] = residual
    return _gather_and_average(buf, idx, vals)


@pytest.mark.timeout(180)
def test_alternative_in_place_hook_with_its_own_residual_passes(no_leftovers):
    ns = {"topk_hook": hook_in_place_then_cloned, "topk_compress": topk_compress}
    for check in (FEEDBACK, "ratio 1: exactly plain DDP's gradients, 2 ranks"):
        o = _one("topk_hook", ns, check)
        assert o.status == "pass", o.message
