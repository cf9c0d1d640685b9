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
