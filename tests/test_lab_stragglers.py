"""Lab 05 (backup workers and stale gradients): the reference passes every check, hidden
ones included; plausible wrong answers are rejected with the sentence that teaches."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from clusterlab import models
from clusterlab.labs import EXERCISES, run_checks
from clusterlab.labs.stragglers import Update, compute

# --- the reference answers --------------------------------------------------------------------


def sync_step(grad, compute_s):
    compute(compute_s)
    dist.all_reduce(grad)
    return grad / dist.get_world_size()


def sync_step_model(c, m, n):
    return c + m * models.harmonic(n)


def backup_step(grad, compute_s, backups):
    rank, world = dist.get_rank(), dist.get_world_size()
    msg = torch.zeros(grad.numel() + 1, dtype=grad.dtype)
    if rank == 0:
        total, heard = torch.zeros_like(grad), set()
        for _ in range(world - 1 - backups):
            heard.add(dist.recv(msg))
            total += msg[1:]
        update = total / (world - 1 - backups)
        sends = [dist.isend(update, w) for w in range(1, world)]
        for w in range(1, world):
            if w not in heard:
                dist.recv(msg, src=w)
        for s in sends:
            s.wait()
        return update
    update = Update(grad, src=0)
    if compute(compute_s, interrupt=update):
        msg[0] = 1.0
        msg[1:] = grad
    dist.send(msg, 0)
    return update.wait()


def backup_step_model(c, m, n, b):
    return c + m * (models.harmonic(n) - models.harmonic(b))


def _simulate(lr, tau, curvature, steps, delay_of=lambda tau: tau):
    """x_(t+1) = x_t - a x_(t-d); returns (peak at half-time block, peak at end, blew up)."""
    a, d = lr * curvature, delay_of(tau)
    x = [1.0] * (d + 1)
    block = 8 * (tau + 1)
    mid = end = 0.0
    for t in range(steps):
        x.append(x[-1] - a * x[-d - 1])
        size = abs(x[-1])
        if size > 1e6:
            return mid, end, True
        if steps // 2 - block <= t < steps // 2:
            mid = max(mid, size)
        elif t >= steps - block:
            end = max(end, size)
        if len(x) > 2 * (d + 1):
            del x[: d + 1]
    return mid, end, False


def is_stable(lr, tau, curvature=1.0):
    mid, end, blew = _simulate(lr, tau, curvature, 20_000)
    return not blew and (end < mid or end < 1e-100)


def largest_stable_lr(tau, curvature=1.0):
    lo, hi = 0.0, 2.5 / curvature
    while hi - lo > 1e-6 / curvature:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if is_stable(mid, tau, curvature) else (lo, mid)
    return lo


def large_tau_stable_lr(tau):
    return math.pi / (2 * tau)


def staleness_mechanism():
    return "B"


REFERENCE = {k: v for k, v in globals().items() if not k.startswith("_") and callable(v)}

# --- wrong answers ------------------------------------------------------------------------------


def sync_sum(grad, compute_s):  # forgets to divide
    compute(compute_s)
    dist.all_reduce(grad)
    return grad


def sync_no_compute(grad, compute_s):  # never computes: the step cannot be what it claims
    dist.all_reduce(grad)
    return grad / dist.get_world_size()


def sync_model_mean(c, m, n):  # the mean rank, not the slowest
    return c + m


def backup_divide_by_n(grad, compute_s, backups):
    """The right gradients, but averaged over N instead of N - b."""
    rank, world = dist.get_rank(), dist.get_world_size()
    msg = torch.zeros(grad.numel() + 1, dtype=grad.dtype)
    if rank == 0:
        total, heard = torch.zeros_like(grad), set()
        for _ in range(world - 1 - backups):
            heard.add(dist.recv(msg))
            total += msg[1:]
        update = total / (world - 1)
        sends = [dist.isend(update, w) for w in range(1, world)]
        for w in range(1, world):
            if w not in heard:
                dist.recv(msg, src=w)
        for s in sends:
            s.wait()
        return update
    return _worker(grad, compute_s, msg)


def _worker(grad, compute_s, msg, interrupt=True):
    update = Update(grad, src=0)
    if compute(compute_s, interrupt=update if interrupt else None):
        msg[0] = 1.0
        msg[1:] = grad
    dist.send(msg, 0)
    return update.wait()


def backup_first_ranks(grad, compute_s, backups):
    """Uses ranks 1..N-b, whoever finished first."""
    rank, world = dist.get_rank(), dist.get_world_size()
    msg = torch.zeros(grad.numel() + 1, dtype=grad.dtype)
    if rank == 0:
        keep = world - 1 - backups
        total = torch.zeros_like(grad)
        for w in range(1, keep + 1):
            dist.recv(msg, src=w)
            total += msg[1:]
        update = total / keep
        sends = [dist.isend(update, w) for w in range(1, world)]
        for w in range(keep + 1, world):
            dist.recv(msg, src=w)
        for s in sends:
            s.wait()
        return update
    return _worker(grad, compute_s, msg)


def backup_different_updates(grad, compute_s, backups):
    """Sends the update only to the workers it used; the late ones keep their own gradient."""
    rank, world = dist.get_rank(), dist.get_world_size()
    msg = torch.zeros(grad.numel() + 1, dtype=grad.dtype)
    used = torch.zeros(1)
    if rank == 0:
        total, heard = torch.zeros_like(grad), set()
        for _ in range(world - 1 - backups):
            heard.add(dist.recv(msg))
            total += msg[1:]
        update = total / (world - 1 - backups)
        for w in range(1, world):
            if w not in heard:
                dist.recv(msg, src=w)
        for w in range(1, world):
            dist.send(torch.ones(1) if w in heard else torch.zeros(1), w)
            if w in heard:
                dist.send(update, w)
        return update
    compute(compute_s)
    msg[0], msg[1:] = 1.0, grad
    dist.send(msg, 0)
    dist.recv(used, 0)
    if used.item():
        dist.recv(grad, 0)
    return grad


def backup_no_interrupt(grad, compute_s, backups):
    """The right aggregate, but late workers finish computing a gradient nobody uses."""
    rank = dist.get_rank()
    if rank == 0:
        return backup_step(grad, compute_s, backups)
    msg = torch.zeros(grad.numel() + 1, dtype=grad.dtype)
    return _worker(grad, compute_s, msg, interrupt=False)


def backup_gather_mask(grad, compute_s, backups):
    """all_gather everyone's gradient and finish time, average the first N - b: correct,
    identical everywhere, and no faster than waiting for all."""
    rank, world = dist.get_rank(), dist.get_world_size()
    compute(compute_s)
    mine = torch.cat([torch.tensor([time_now() if rank else math.inf], dtype=grad.dtype), grad])
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    first = sorted(range(1, world), key=lambda r: float(every[r][0]))[: world - 1 - backups]
    return torch.stack([every[r][1:] for r in first]).mean(dim=0)


def time_now():
    import clusterlab

    return clusterlab.now()


def backup_model_wrong_harmonic(c, m, n, b):  # H_(N-b) instead of H_b
    return c + m * (models.harmonic(n) - models.harmonic(n - b))


def bisect_returns_hi(tau, curvature=1.0):
    lo, hi = 0.0, 2.5 / curvature
    while hi - lo > 1e-6 / curvature:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if is_stable(mid, tau, curvature) else (lo, mid)
    return hi


def bisect_few_iterations(tau, curvature=1.0):
    lo, hi = 0.0, 2.5 / curvature
    for _ in range(8):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if is_stable(mid, tau, curvature) else (lo, mid)
    return lo


def stable_short_run(lr, tau, curvature=1.0):
    """'Stable' if |x| is below its start after 200 steps: a mode growing 0.05% per step
    has barely grown by then."""
    a, x = lr * curvature, [1.0] * (tau + 1)
    for _ in range(200):
        x.append(x[-1] - a * x[-tau - 1])
    return max(abs(v) for v in x[-tau - 1:]) < 1.0


def stable_loss_falls(lr, tau, curvature=1.0):
    """'Stable' if the loss fell over the first 5 steps."""
    a, x = lr * curvature, [1.0] * (tau + 1)
    for _ in range(5):
        x.append(x[-1] - a * x[-tau - 1])
    return x[-1] ** 2 < 1.0


def stable_delay_off_by_one(lr, tau, curvature=1.0):  # uses x_(t-τ-1)
    mid, end, blew = _simulate(lr, tau, curvature, 20_000, delay_of=lambda t: t + 1)
    return not blew and (end < mid or end < 1e-100)


def stable_ignores_curvature(lr, tau, curvature=1.0):
    return is_stable(lr, tau, 1.0)


def bisect_ignores_curvature(tau, curvature=1.0):
    return largest_stable_lr(tau, 1.0)


def asymptote_pi_over_tau(tau):
    return math.pi / tau


# From the labs probe (shared/reviews/labs_probe.md): wrong answers the checks once accepted.


def backup_any_source_drain(grad, compute_s, backups):
    """Probe item 5: the late messages drained from ANY source (the pitfall the notebook
    warns about): it takes an early worker's next gradient when that comes first."""
    rank, world = dist.get_rank(), dist.get_world_size()
    msg = torch.zeros(grad.numel() + 1, dtype=grad.dtype)
    if rank == 0:
        total, heard = torch.zeros_like(grad), set()
        for _ in range(world - 1 - backups):
            heard.add(dist.recv(msg))
            total += msg[1:]
        update = total / (world - 1 - backups)
        sends = [dist.isend(update, w) for w in range(1, world)]
        for _ in range(backups):
            dist.recv(msg)  # should be dist.recv(msg, src=w) for each w not heard from
        for s in sends:
            s.wait()
        return update
    update = Update(grad, src=0)
    if compute(compute_s, interrupt=update):
        msg[0] = 1.0
        msg[1:] = grad
    dist.send(msg, 0)
    return update.wait()


def large_tau_exact(tau):
    """Probe item 6: the closed form itself, not its large-τ expansion."""
    return 2 * math.sin(math.pi / (4 * tau + 2))


def largest_closed_form(tau, curvature=1.0):
    """The exact limit, not found with is_stable: at the limit itself is_stable says no."""
    return 2 * math.sin(math.pi / (4 * tau + 2)) / curvature


# --- the tests ----------------------------------------------------------------------------------


def _outcome(exercise, names, check_name):
    """The outcome of the first check whose name starts with check_name (run alone)."""
    names_of = [c.name for c in EXERCISES[exercise].checks]
    matches = [n for n in names_of if n.startswith(check_name)]
    assert matches, names_of
    report = run_checks(exercise, {**REFERENCE, **names}, hidden=True, only=matches[0])
    return report.outcomes[0]


def _rejects(exercise, names, check_name, *phrases):
    o = _outcome(exercise, names, check_name)
    assert o.status == "fail", (o.status, o.message)
    for phrase in phrases:
        assert phrase in o.message, o.message
    return o.message


@pytest.mark.timeout(120)
def test_reference_passes_visible_checks(no_leftovers):
    # The hidden checks of the solved notebook run under nbval (test.sh, strict): here the
    # reference only has to pass what the wrong answers below are compared against.
    for exercise in ("straggler_wait_all", "straggler_backups", "stale_stability",
                     "stale_explain"):
        report = run_checks(exercise, REFERENCE, hidden=False)
        bad = [(o.check, o.status, o.message) for o in report.outcomes
               if o.status not in ("pass", "skip")]
        assert not bad, bad


@pytest.mark.timeout(120)
def test_sync_sum_is_rejected(no_leftovers):
    _rejects("straggler_wait_all", {"sync_step": sync_sum}, "every rank returns", "SUM",
             "divide by dist.get_world_size()")


@pytest.mark.timeout(120)
def test_sync_without_compute_is_rejected(no_leftovers):
    _rejects("straggler_wait_all", {"sync_step": sync_no_compute}, "every rank returns",
             "did not call compute(compute_s)")


def test_sync_model_mean_is_rejected():
    # only the closed form: it is checked first, and the checks that need sync_step say "todo"
    report = run_checks("straggler_wait_all", {"sync_step_model": sync_model_mean}, hidden=True)
    first = report.outcomes[0]
    assert first.status == "fail" and "MEAN rank" in first.message, first.message
    assert all(o.status == "todo" for o in report.outcomes[1:])


@pytest.mark.timeout(120)
def test_backups_averaged_over_n_are_rejected(no_leftovers):
    _rejects("straggler_backups", {"backup_step": backup_divide_by_n}, "the update",
             "divides the sum", "N - b")


@pytest.mark.timeout(120)
def test_backups_first_ranks_not_first_arrivals_are_rejected(no_leftovers):
    _rejects("straggler_backups", {"backup_step": backup_first_ranks}, "the update",
             "first N - b RANKS", "ARRIVE")


@pytest.mark.timeout(120)
def test_backups_leaving_ranks_with_different_updates_are_rejected(no_leftovers):
    _rejects("straggler_backups", {"backup_step": backup_different_updates}, "the update",
             "DIFFERENT updates", "late worker")


def _aggregate_right_saving_wrong(wrong, *phrases):
    """The aggregate check passes (exact, identical everywhere), the saving check fails."""
    report = run_checks("straggler_backups", {**REFERENCE, "backup_step": wrong}, hidden=True)
    by = {o.check: o for o in report.outcomes}
    aggregate = next(o for name, o in by.items() if name.startswith("the update"))
    assert aggregate.status == "pass", aggregate.message
    for o in (o for name, o in by.items() if name.startswith(("measured saving", "other N"))):
        assert o.status == "fail", (o.check, o.message)
        for phrase in phrases:
            assert phrase in o.message, o.message


@pytest.mark.timeout(120)
def test_backups_without_interrupt_are_rejected(no_leftovers):
    _aggregate_right_saving_wrong(backup_no_interrupt, "kept computing", "interrupt=update")


@pytest.mark.timeout(120)
def test_backups_by_gather_and_mask_are_rejected_for_no_saving(no_leftovers):
    _aggregate_right_saving_wrong(backup_gather_mask, "every rank waited for the slowest",
                                  "collective")


def test_backup_formula_with_h_n_minus_b_is_rejected():
    report = run_checks("straggler_backups", {"backup_step_model": backup_model_wrong_harmonic},
                        hidden=True)
    first = report.outcomes[0]
    assert first.status == "fail" and "H_(N-b)" in first.message and "H_b" in first.message
    assert all(o.status == "todo" for o in report.outcomes[1:])  # no backup_step: not run


def test_bisection_returning_the_first_unstable_lr_is_rejected():
    _rejects("stale_stability", {"largest_stable_lr": bisect_returns_hi}, "largest_stable_lr",
             "first unstable lr", "return lo")


def test_bisection_with_too_few_iterations_is_rejected():
    _rejects("stale_stability", {"largest_stable_lr": bisect_few_iterations},
             "largest_stable_lr", "bracket is still wide")


def test_too_short_simulation_is_rejected():
    _rejects("stale_stability", {"is_stable": stable_short_run}, "is_stable is right",
             "short simulation", "grows there by only")


def test_loss_falling_over_a_few_steps_is_rejected():
    _rejects("stale_stability", {"is_stable": stable_loss_falls}, "is_stable is right",
             "first few steps")


def test_delay_off_by_one_is_rejected():
    _rejects("stale_stability", {"is_stable": stable_delay_off_by_one}, "is_stable is right",
             "limit for τ =", "steps old")


def test_ignoring_curvature_is_rejected_by_the_hidden_check():
    names = {"is_stable": stable_ignores_curvature, "largest_stable_lr": bisect_ignores_curvature}
    assert _outcome("stale_stability", names, "largest_stable_lr").status == "pass"  # λ = 1
    _rejects("stale_stability", names, "other τ and curvatures", "curvature")


def test_wrong_asymptote_and_mechanism_are_rejected():
    _rejects("stale_explain", {"large_tau_stable_lr": asymptote_pi_over_tau}, "large_tau",
             "constant is wrong", "π/(2τ+1)")
    _rejects("stale_explain", {"staleness_mechanism": lambda: "A"}, "the mechanism",
             "no noise")
    _rejects("stale_explain", {"staleness_mechanism": lambda: "d"}, "the mechanism",
             "not random")


@pytest.mark.timeout(240)
def test_probe_any_source_drain_is_rejected_every_time(no_leftovers):
    """Probe item 5: accepted in 12 of 18 runs before the race was staged; now the staged
    late message makes the early worker's next gradient come first, every run."""
    for _ in range(3):
        _rejects("straggler_backups", {"backup_step": backup_any_source_drain},
                 "the update: the exact average", "BY SOURCE")


def test_probe_the_exact_closed_form_is_not_the_large_tau_form():
    _rejects("stale_explain", {"large_tau_stable_lr": large_tau_exact}, "large_tau",
             "that is the closed form", "Expand it for large τ")


@pytest.mark.parametrize("answer", ["Because stale gradients are noisier (A)", "B because",
                                    "b) delayed feedback", 2, None])
def test_probe_the_mechanism_must_be_one_letter(answer):
    o = _outcome("stale_explain", {"staleness_mechanism": lambda: answer}, "the mechanism")
    assert o.status == "fail" and "exactly one letter" in o.message, o.message


def test_a_lower_case_letter_is_accepted():
    assert _outcome("stale_explain", {"staleness_mechanism": lambda: " b "},
                    "the mechanism").status == "pass"


def test_probe_a_closed_form_largest_lr_is_told_what_it_is():
    o = _outcome("stale_stability", {"largest_stable_lr": largest_closed_form},
                 "largest_stable_lr")
    assert o.status == "fail", o.message  # the reference is_stable: the limit is unstable
    assert "the limit itself" in o.message, o.message
    assert "returns the first unstable" not in o.message, o.message


def test_every_wrong_mechanism_is_answered_with_its_own_flaw():
    for letter, phrase in (("A", "no noise"), ("C", "same curvature"), ("D", "not exponentially")):
        _rejects("stale_explain", {"staleness_mechanism": lambda letter=letter: letter},
                 "the mechanism", phrase)
