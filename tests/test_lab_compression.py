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
