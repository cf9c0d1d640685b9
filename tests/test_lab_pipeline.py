"""Lab 09 (pipeline schedules): the reference GPipe and 1F1B pass every check, hidden ones
included, and typical mistakes fail the intended check with the sentence that teaches.
Every check runs real stages on real ranks with real send/recv."""

from __future__ import annotations

from collections import deque

import pytest
import torch
import torch.distributed as dist

from clusterlab.labs import run_checks


def gpipe(stage, inputs, targets, loss_fn):
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(inputs)
    held, total = [], 0.0
    for i in range(m):
        if rank == 0:
            x = inputs[i]
        else:
            x = torch.empty_like(inputs[i])
            dist.recv(x, rank - 1)
            x.requires_grad_()
        y = stage(x)
        if rank < p - 1:
            dist.send(y.detach(), rank + 1)
        held.append((x, y))
    for i, (x, y) in enumerate(held):
        if rank == p - 1:
            loss = loss_fn(y, targets[i]) / m
            total += loss.item()
            loss.backward()
        else:
            g = torch.empty_like(y)
            dist.recv(g, rank + 1)
            y.backward(g)
        if rank > 0:
            dist.send(x.grad, rank - 1)
    return total


def one_f_one_b(stage, inputs, targets, loss_fn):
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(inputs)
    held, sends, total = deque(), [], 0.0

    def forward(i):
        if rank == 0:
            x = inputs[i]
        else:
            x = torch.empty_like(inputs[i])
            dist.recv(x, rank - 1)
            x.requires_grad_()
        y = stage(x)
        if rank < p - 1:
            out = y.detach()
            sends.append((dist.isend(out, rank + 1), out))
        held.append((i, x, y))

    def backward():
        nonlocal total
        i, x, y = held.popleft()
        if rank == p - 1:
            loss = loss_fn(y, targets[i]) / m
            total += loss.item()
            loss.backward()
        else:
            g = torch.empty_like(y)
            dist.recv(g, rank + 1)
            y.backward(g)
        if rank > 0:
            sends.append((dist.isend(x.grad, rank - 1), x.grad))

    warm = min(p - 1 - rank, m)
    for i in range(warm):
        forward(i)
    for i in range(warm, m):
        forward(i)
        backward()
    while held:
        backward()
    for work, _ in sends:
        work.wait()
    return total


def gpipe_sum_not_mean(stage, inputs, targets, loss_fn):  # forgets the 1/m
    return gpipe(stage, inputs, targets, lambda y, t: loss_fn(y, t) * len(inputs))


EQUAL = "equal to one process: loss and every gradient, 2 stages x 4 micro-batches"


def _one(exercise, fn, check):
    report = run_checks(exercise, {exercise: fn}, only=check)
    (outcome,) = [o for o in report.outcomes if o.status != "skip"]
    return outcome


# Every check, hidden ones included, runs on the reference in solutions/ under nbval; these
# tests pay for a few cluster runs only.
@pytest.mark.timeout(120)
def test_reference_gpipe_equals_one_process_and_a_missing_division_fails(no_leftovers):
    assert _one("gpipe", gpipe, EQUAL).status == "pass"
    bad = _one("gpipe", gpipe_sum_not_mean, EQUAL)
    assert bad.status == "fail" and "divide each micro-batch's loss by m" in bad.message


@pytest.mark.timeout(120)
def test_1f1b_holds_p_activations_and_gpipe_in_its_place_fails(no_leftovers):
    check = "at most p micro-batches in flight, and the bubble of GPipe, 4 stages x 8"
    good = _one("one_f_one_b", one_f_one_b, check)
    assert good.status == "pass", good.message
    bad = _one("one_f_one_b", gpipe, check)
    assert bad.status == "fail" and "held the activations of 8" in bad.message, bad.message


# --- from the labs probe (shared/reviews/labs_probe.md) -----------------------------------------


def one_f_one_b_same_warmup(stage, inputs, targets, loss_fn):
    """Every stage warms up with p - 1 forwards (stage 0's count), not p - 1 - rank."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(inputs)
    held, sends, total = deque(), [], 0.0

    def forward(i):
        if rank == 0:
            x = inputs[i]
        else:
            x = torch.empty_like(inputs[i])
            dist.recv(x, rank - 1)
            x.requires_grad_()
        y = stage(x)
        if rank < p - 1:
            out = y.detach()
            sends.append((dist.isend(out, rank + 1), out))
        held.append((i, x, y))

    def backward():
        nonlocal total
        i, x, y = held.popleft()
        if rank == p - 1:
            loss = loss_fn(y, targets[i]) / m
            total += loss.item()
            loss.backward()
        else:
            g = torch.empty_like(y)
            dist.recv(g, rank + 1)
            y.backward(g)
        if rank > 0:
            sends.append((dist.isend(x.grad, rank - 1), x.grad))

    warm = min(p - 1, m)  # should be min(p - 1 - rank, m)
    for i in range(warm):
        forward(i)
    for i in range(warm, m):
        forward(i)
        backward()
    while held:
        backward()
    for work, _ in sends:
        work.wait()
    return total


def gpipe_last_stage_all_at_once(stage, inputs, targets, loss_fn):
    """The last stage backpropagates the sum of all micro-batch losses at once, then sends
    every gradient: right numbers, but no gradient leaves it until its backwards are over."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(inputs)
    held = []
    for i in range(m):
        if rank == 0:
            x = inputs[i]
        else:
            x = torch.empty_like(inputs[i])
            dist.recv(x, rank - 1)
            x.requires_grad_()
        y = stage(x)
        if rank < p - 1:
            dist.send(y.detach(), rank + 1)
        held.append((x, y))
    if rank == p - 1:
        loss = sum(loss_fn(y, targets[i]) for i, (_, y) in enumerate(held)) / m
        loss.backward()
        for x, _ in held:
            dist.send(x.grad, rank - 1)
        return loss.item()
    for x, y in held:
        g = torch.empty_like(y)
        dist.recv(g, rank + 1)
        y.backward(g)
        if rank > 0:
            dist.send(x.grad, rank - 1)
    return 0.0


@pytest.mark.timeout(120)
def test_probe_a_1f1b_warm_up_wrong_on_later_stages_is_named(no_leftovers):
    check = "at most p micro-batches in flight, and the bubble of GPipe, 4 stages x 8"
    bad = _one("one_f_one_b", one_f_one_b_same_warmup, check)
    assert bad.status == "fail", bad.message
    assert "stage 1 held the activations of 4" in bad.message, bad.message
    assert "p - 1 - r = 2 forwards" in bad.message and "own sends" not in bad.message


@pytest.mark.timeout(120)
def test_probe_a_gpipe_whose_last_stage_backs_up_at_once_is_named(no_leftovers):
    bad = _one("gpipe", gpipe_last_stage_all_at_once,
               "bubble measured against (p-1)/(m+p-1), 4 stages x 4 micro-batches")
    assert bad.status == "fail", bad.message
    assert "all of its backwards" in bad.message, bad.message
    assert "start micro-batch i+1" not in bad.message, bad.message


# --- predict first --------------------------------------------------------------------------------

PREDICT = "your predictions of each stage's peak activations match the measurement"


@pytest.mark.timeout(120)
def test_predictions_checked_against_the_measurement(no_leftovers):
    ns = {"gpipe": gpipe, "one_f_one_b": one_f_one_b, "PREDICTED_PEAKS_GPIPE": [8, 8, 8, 8],
          "PREDICTED_PEAKS_1F1B": [4, 3, 2, 1]}
    report = run_checks("pipeline_predict", ns, only=PREDICT)
    assert report.passed, report.text()
    wrong = run_checks("pipeline_predict", {**ns, "PREDICTED_PEAKS_1F1B": [4, 4, 4, 4]},
                       only=PREDICT)
    (o,) = wrong.outcomes
    assert o.status == "fail" and "1F1B: you predicted [4, 4, 4, 4]" in o.message, o.message
    assert "GPipe: you predicted" not in o.message
    shape = run_checks("pipeline_predict", {**ns, "PREDICTED_PEAKS_GPIPE": 8}, only=PREDICT)
    assert "a list of 4 whole numbers" in shape.outcomes[0].message
