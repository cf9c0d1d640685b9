"""clusterlab.monitor: every injected synchronisation failure is flagged, naming the rank and
the step, and a healthy run stays silent. The failures are injected into a real DDP loop on
real multi-process clusters."""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from clusterlab import Cluster
from clusterlab.monitor import (
    Alert,
    SyncError,
    SyncMonitor,
    SyncWarning,
    _majority,
    _pack,
    _unpack,
    compare_replicas,
    fingerprint,
)

pytestmark = pytest.mark.timeout(120)

STEPS = 30  # with every=10, checks run at steps 9, 19 and 29


# --- the training loop the failures are injected into ---------------------------------------


def _no_op(*args):
    return None


def train(steps=STEPS, on_alert="warn", every=10, rtol=0.0, atol=0.0, seed_per_rank=False,
          after_wrap=_no_op, before_forward=_no_op, after_backward=_no_op, loss_of=None,
          comm_hook=None, hook_state=None, subgroup=None, bucket_view=False, label_of=None):
    """A small DDP regression with injection points; returns what the monitor saw.

    Every injection function is called on every rank (as f(step, rank, model)) and decides
    itself whether to act, as a bug on one rank would."""
    rank = dist.get_rank()
    group = dist.new_group(subgroup) if subgroup else None
    if subgroup and rank not in subgroup:
        return None
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group,
                                                    gradient_as_bucket_view=bucket_view)
    hook_state = {"step": 0, "group": group, **(hook_state or {})}
    if comm_hook is not None:
        ddp.register_comm_hook(hook_state, comm_hook)
    if seed_per_rank:  # dropout masks differ between ranks: activations only, never weights
        torch.manual_seed(1000 + rank)
    after_wrap(0, rank, model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    mon = SyncMonitor(ddp, every=every, group=group, on_alert=on_alert, rtol=rtol, atol=atol)
    gen = torch.Generator().manual_seed(100 + rank)
    error = None
    try:
        for step in range(steps):
            with mon.step(step if label_of is None else label_of(step, rank)) as s:
                hook_state["step"] = step
                x = torch.randn(16, 8, generator=gen)
                before_forward(step, rank, model)
                loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
                loss.backward()
                after_backward(step, rank, model)
                s.after_backward()
                opt.step()
                opt.zero_grad()
                s.record_loss(loss if loss_of is None else loss_of(step, rank, loss))
        mon.check()  # the verdict on the last check step (and any steps after it)
    except SyncError as exc:
        error = str(exc)
    return {
        "alerts": [(a.step, a.kind, a.ranks, a.detail) for a in mon.alerts],
        "error": error,
        "identical": compare_replicas(model, group=group) == [],
        "report": mon.report(),
        "steps": mon.steps,
        "checks": mon.checks,
    }


def first(alerts, kind, where=None):
    """The first alert of a kind (and detail["where"]), as (step, ranks, detail)."""
    for step, k, ranks, detail in alerts:
        if k == kind and (where is None or detail.get("where") == where):
            return step, ranks, detail
    raise AssertionError(f"no {kind} alert ({where}) in {alerts}")


@pytest.fixture(scope="module")
def netem():
    with Cluster(nodes=3, nic="delay 200us", timeout=60) as cl:
        yield cl


@pytest.fixture(scope="module")
def gloo():
    with Cluster(nodes=3, nic=None, timeout=60) as cl:
        yield cl


# --- healthy runs stay silent ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["gloo", "netem"])
def test_healthy_run_has_no_alerts(backend, request):
    cl = request.getfixturevalue(backend)
    for out in cl.run(train):
        assert out["alerts"] == [], out["report"]
        assert out["identical"]
        assert out["checks"] == 3
        assert "no alerts" in out["report"]


def test_dropout_seeded_per_rank_is_not_flagged(netem):
    # Different dropout masks per rank change activations and local gradients; the
    # all-reduce averages them, so the replicas stay identical: nothing to report.
    for out in netem.run(train, seed_per_rank=True):
        assert out["alerts"] == [], out["report"]


# --- replicas that drift apart --------------------------------------------------------------


def _bump_rank2_at_step7(step, rank, model):
    if rank == 2 and step == 7:
        model[3].weight.data += 1e-3


def test_parameter_changed_on_one_rank_is_named(netem):
    for out in netem.run(train, before_forward=_bump_rank2_at_step7):
        step, ranks, detail = first(out["alerts"], "parameter_mismatch")
        assert (step, ranks) == (9, [2])
        assert detail["parameter"] == "3.weight"
        assert detail["reference_rank"] == 0
        assert not out["identical"]  # "warn" only reports


def test_repair_makes_replicas_identical_again(netem):
    outs = netem.run(train, on_alert="repair", before_forward=_bump_rank2_at_step7)
    for out in outs:
        kinds = [(s, k, r) for s, k, r, _ in out["alerts"]]
        assert kinds == [(9, "parameter_mismatch", [2]), (9, "repair", [2])]
        assert out["identical"]


def test_raise_raises_on_every_rank_without_a_hang(netem):
    t0 = time.monotonic()
    outs = netem.run(train, on_alert="raise", before_forward=_bump_rank2_at_step7)
    assert time.monotonic() - t0 < 20
    for out in outs:
        assert out["error"] is not None
        assert "step 9: parameter_mismatch on rank(s) [2]" in out["error"]
        assert out["steps"] == 11  # the verdict on step 9 came at the end of step 10


def _bump_rank0_at_step7(step, rank, model):
    if rank == 0 and step == 7:
        model[0].bias.data -= 1e-3


def test_repair_takes_the_majority_not_blindly_rank_0(netem):
    for out in netem.run(train, on_alert="repair", before_forward=_bump_rank0_at_step7):
        step, ranks, detail = first(out["alerts"], "parameter_mismatch")
        assert (step, ranks, detail["reference_rank"], detail["parameter"]) == (9, [0], 1, "0.bias")
        assert first(out["alerts"], "repair")[2]["source_rank"] == 1
        assert out["identical"]


def _reinit_per_rank(step, rank, model):
    torch.manual_seed(rank)  # per-rank RNG misuse: a re-initialisation after wrapping
    model[0].reset_parameters()


def _noise_per_rank(step, rank, model):
    if step == 3:
        gen = torch.Generator().manual_seed(rank)
        for p in model.parameters():
            p.data += 1e-6 * torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize("where", ["after_wrap", "before_forward"])
def test_per_rank_rng_misuse_on_weights_is_flagged(netem, where):
    inject = {"after_wrap": _reinit_per_rank, "before_forward": _noise_per_rank}[where]
    for out in netem.run(train, **{where: inject}):
        step, ranks, detail = first(out["alerts"], "parameter_mismatch")
        assert (step, ranks) == (9, [1, 2])  # all differ: no majority, rank 0 is the reference
        assert detail["parameter"] == "0.weight"


def test_tolerance_accepts_tiny_drift_but_not_large(netem):
    def drift(size):
        def inject(step, rank, model):
            if rank == 1 and step == 3:
                model[0].weight.data *= 1 + size
        return inject

    for out in netem.run(train, rtol=1e-4, before_forward=drift(1e-7)):
        assert out["alerts"] == [], out["report"]
    for out in netem.run(train, rtol=1e-4, before_forward=drift(1e-2)):
        assert first(out["alerts"], "parameter_mismatch")[:2] == (9, [1])
    for out in netem.run(train, before_forward=drift(1e-7)):  # exact by default
        assert first(out["alerts"], "parameter_mismatch")[:2] == (9, [1])


# --- corrupted gradients --------------------------------------------------------------------


def _nan_grad_on_rank1_at_step13(step, rank, model):
    if rank == 1 and step == 13:  # a backward hook: before the all-reduce, on rank 1 only
        handle = model[0].weight.register_hook(lambda g: (handle.remove(), g * math.nan)[1])


@pytest.mark.parametrize("bucket_view", [False, True])
def test_nan_gradient_names_the_rank_that_made_it(netem, bucket_view):
    # (gradient_as_bucket_view=True makes DDP reduce gradients in place during backward:
    # the monitor then reads each local gradient as soon as it is produced.)
    for out in netem.run(train, bucket_view=bucket_view,
                         before_forward=_nan_grad_on_rank1_at_step13):
        step, ranks, detail = first(out["alerts"], "nan", "gradient")
        assert (step, ranks) == (13, [1])
        assert detail["first"] == {1: (13, "0.weight")}
        # The all-reduce spread it: every replica's parameters are non-finite now.
        assert first(out["alerts"], "nan", "parameter")[:2] == (19, [0, 1, 2])
        # Only rank 1 is blamed: the others computed NaN later, from NaN weights.
        assert len([a for a in out["alerts"] if a[3].get("where") == "gradient"]) == 1
        assert not [a for a in out["alerts"] if a[3].get("where") == "gradient_after_sync"]


def _nan_in_comm_hook(state, bucket):
    if state["step"] == state["nan_step"] and dist.get_rank() == 1:
        bucket.buffer()[0] = math.nan  # after this rank's gradient was handed to the all-reduce
    return default_hooks.allreduce_hook(state["group"], bucket)


def test_nan_entering_in_a_comm_hook_is_flagged_without_blaming_a_rank(netem):
    # At a check step, the synchronised gradients show it at once...
    for out in netem.run(train, comm_hook=_nan_in_comm_hook, hook_state={"nan_step": 9}):
        step, ranks, _ = first(out["alerts"], "nan", "gradient_after_sync")
        assert (step, ranks) == (9, [0, 1, 2])
        assert first(out["alerts"], "nan", "parameter")[:2] == (9, [0, 1, 2])
        # No rank is named as the origin: every rank's own gradient was finite.
        assert not [a for a in out["alerts"] if a[3].get("where") == "gradient"]
    # ... at another step, the weights show it at the next check, with the same reasoning.
    for out in netem.run(train, comm_hook=_nan_in_comm_hook, hook_state={"nan_step": 13}):
        step, ranks, _ = first(out["alerts"], "nan", "parameter")
        assert (step, ranks) == (19, [0, 1, 2])
        assert "came in through the gradient all-reduce" in out["report"]
        assert not [a for a in out["alerts"] if a[3].get("where") == "gradient"]


def _flip_bit(step_to_flip):
    def inject(step, rank, model):
        if rank == 2 and step == step_to_flip:  # after the all-reduce, before optimizer.step
            bits = model[0].weight.grad.view(-1)[:1].view(torch.int32)
            bits ^= 1 << 22  # the highest mantissa bit of one float
    return inject


def test_bit_flip_after_the_all_reduce_is_named(netem):
    # At a plain step: the weights of rank 2 drift, seen at the next check.
    for out in netem.run(train, after_backward=_flip_bit(12)):
        step, ranks, detail = first(out["alerts"], "parameter_mismatch")
        assert (step, ranks, detail["parameter"]) == (19, [2], "0.weight")
    # At a check step: the synchronised gradients themselves disagree.
    for out in netem.run(train, after_backward=_flip_bit(9)):
        step, ranks, detail = first(out["alerts"], "gradient_mismatch")
        assert (step, ranks, detail["parameter"]) == (9, [2], "0.weight")


# --- time and loss --------------------------------------------------------------------------


def _sleep_rank1(step, rank, model):
    if rank == 1:
        time.sleep(0.03)


@pytest.mark.parametrize("where", ["before_forward", "after_backward"])
def test_straggler_is_named(netem, where):
    for out in netem.run(train, steps=10, **{where: _sleep_rank1}):
        assert [(s, k, r) for s, k, r, _ in out["alerts"]] == [(9, "straggler", [1])]
        busy = first(out["alerts"], "straggler")[2]["busy_s"]
        assert busy[1] > 0.025 > busy[0]


def _spike_at_step15(step, rank, loss):
    return loss * 100 if step == 15 else loss


def test_loss_spike_is_reported_at_its_step(netem):
    for out in netem.run(train, loss_of=_spike_at_step15):
        assert [(s, k, r) for s, k, r, _ in out["alerts"]] == [(15, "loss_spike", [0, 1, 2])]


def _loss_times_10_on_rank2(step, rank, loss):
    return loss * 10 if rank == 2 else loss


def test_a_rank_with_other_losses_is_an_outlier(netem):
    for out in netem.run(train, loss_of=_loss_times_10_on_rank2):
        assert {(s, k, tuple(r)) for s, k, r, _ in out["alerts"]} == \
            {(9, "loss_outlier", (2,)), (19, "loss_outlier", (2,)), (29, "loss_outlier", (2,))}


def _one_step_ahead_on_rank1(step, rank):
    return step + 1 if rank == 1 else step


def test_ranks_out_of_step_are_named(netem):
    for out in netem.run(train, steps=10, label_of=_one_step_ahead_on_rank1):
        step, ranks, detail = first(out["alerts"], "step_mismatch")
        assert (step, ranks, detail["steps"]) == (9, [1], {0: 9, 1: 10, 2: 9})


def test_works_on_a_subgroup(netem):
    outs = netem.run(train, subgroup=[1, 2], before_forward=_bump_rank2_at_step7)
    assert outs[0] is None
    for out in outs[1:]:
        step, ranks, detail = first(out["alerts"], "parameter_mismatch")
        assert (step, ranks, detail["reference_rank"]) == (9, [2], 1)


# --- the pure helpers -----------------------------------------------------------------------


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def test_identical_modules_have_identical_fingerprints():
    assert torch.equal(fingerprint(_mlp()), fingerprint(_mlp()))
    assert not torch.equal(fingerprint(_mlp(0)), fingerprint(_mlp(1)))


def test_one_changed_float_flips_the_fingerprint():
    ref = fingerprint(_mlp())
    for index in range(4):  # several places, each changed by a single ulp
        model = _mlp()
        w = model[2].weight.data.view(-1)
        w[index] = torch.nextafter(w[index], torch.tensor(math.inf))
        assert not torch.equal(fingerprint(model), ref)


def test_swapped_values_and_swapped_tensors_change_the_fingerprint():
    model = _mlp()
    w = model[0].weight.data.view(-1)
    w[[0, 1]] = w[[1, 0]]  # the plain sum is unchanged, the weighted one is not
    assert not torch.equal(fingerprint(model), fingerprint(_mlp()))


def test_majority_names_the_odd_ones_out():
    same = lambda a, b: a == b
    assert _majority([5, 5, 7, 5], same) == (0, [2])
    assert _majority([7, 5, 5], same) == (1, [0])
    assert _majority([1, 2], same) == (0, [1])  # a tie: the first rank is the reference
    assert _majority([1, 2, 3], same) == (0, [1, 2])


def test_summary_round_trips_exactly_through_int64():
    from clusterlab.monitor import _FIELDS, _FLOATS

    summary = {k: (math.nan if k == "loss_median" else 0.1 * i) if k in _FLOATS else -i
               for i, k in enumerate(_FIELDS)}
    back = _unpack(_pack(summary).unsqueeze(0))[0]
    for k in _FIELDS:
        assert back[k] == summary[k] or (math.isnan(back[k]) and math.isnan(summary[k]))


def test_single_process_monitor_flags_a_nan_loss():
    # Without a process group the monitor still runs (world of one): handy in a notebook.
    model = _mlp()
    mon = SyncMonitor(model, every=5)
    with pytest.warns(SyncWarning, match="step 6: nan on rank"):
        for step in range(10):
            with mon.step(step) as s:
                model(torch.ones(3, 4)).sum().backward()
                s.after_backward()
                s.record_loss(math.nan if step == 6 else 1.0)
        assert mon.alerts == []  # the verdict on step 9 would come at the end of step 10...
        assert "still on its way" in mon.report()
        mon.check()  # ... or now
    assert [(a.step, a.kind, a.ranks) for a in mon.alerts] == [(6, "nan", [0])]
    assert mon.checks == 2  # steps 0-4 and 5-9: check() had no unchecked steps left
    with mon.step(10):
        model(torch.ones(3, 4)).sum().backward()
    mon.check()
    assert mon.checks == 3
    assert isinstance(mon.alerts[0], Alert)
    assert "nan x1" in mon.report()
    mon.close()
