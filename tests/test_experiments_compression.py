"""Experiments of notebook 11 (compressing communication): the hooks' bytes, error feedback,
and the break-even model.

Real ranks through the "netem" backend on a shared 2-core machine: no absolute times.
"""

from __future__ import annotations

import math

import pytest

from clusterlab.experiments import compression

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftovers")]


@pytest.mark.parametrize("bad", ["gzip", "powersgd", "powersgd:0", "powersgd:1.5", "topk:0",
                                 "topk:2", "fp16:2", "topk:x"])
def test_a_bad_method_is_named(bad):
    with pytest.raises(ValueError, match="method|rank|fraction"):
        compression.parse_method(bad)
    with pytest.raises(TypeError):
        compression.parse_method(4)


def test_predicted_bytes_follow_the_shapes():
    n = sum(math.prod(s) for s in compression.parameter_shapes())
    assert compression.predicted_calls("none", 4) == [("allreduce", 4 * n)]
    assert compression.predicted_calls("bf16", 4) == [("allreduce", 2 * n)]
    ps = compression.predicted_calls("powersgd:2", 4)
    # P (rows x 2) and Q (cols x 2) of the three matrices, biases uncompressed
    assert ps == [("allreduce", 4 * 522), ("allreduce", 4 * 2 * (256 + 256 + 10)),
                  ("allreduce", 4 * 2 * (32 + 256 + 256))]
    k = int(0.01 * n)
    assert compression.predicted_calls("topk:0.01", 8) == [("allgather", 8 * k)]
    # ring bytes per rank: all-reduce 2(p-1)/p n, all-gather (p-1) n
    assert compression.sent_bytes("allreduce", 1000, 4) == pytest.approx(1500)
    assert compression.sent_bytes("allgather", 1000, 4) == pytest.approx(3000)


def test_break_even_falls_with_latency_and_ranks():
    be = compression.breakeven_rate_bps
    assert be("powersgd:1", 4, 2e-3) > be("powersgd:1", 4, 4e-3) > 0
    assert be("powersgd:1", 4, 1e-3) > be("powersgd:1", 64, 1e-3)
    assert be("powersgd:1", 4, 1e-3, overhead_s=1e-3) < be("powersgd:1", 4, 1e-3)
    assert be("fp16", 4, 1e-3) == math.inf  # fewer bytes, no extra rounds: always pays
    # at the break-even rate the two exchanges cost the same
    rate = be("powersgd:4", 8, 1e-3)
    cost = {m: compression.comm_seconds(compression.predicted_calls(m, 8), 8, 1e-3, 8 / rate)
            for m in ("none", "powersgd:4")}
    assert cost["none"] == pytest.approx(cost["powersgd:4"], rel=1e-9)



def test_a_log_latency_makes_the_extra_rounds_cheaper():
    calls = compression.predicted_calls("powersgd:1", 64)
    # the ring's latency terms are the closed forms' alpha coefficients
    assert compression.latency_terms(calls, 64) == compression.comm_seconds(calls, 64, 1.0, 0.0)
    assert compression.latency_terms(calls, 64, "log") == 3 * 2 * 6
    be = compression.breakeven_rate_bps
    # extra rounds: two all-reduces, 2 x 126 delays on a ring, 2 x 12 with lg 64 = 6
    ratio = be("powersgd:1", 64, 1e-5, latency="log") / be("powersgd:1", 64, 1e-5)
    assert ratio == pytest.approx(252 / 24)
    with pytest.raises(ValueError, match="latency"):
        compression.latency_terms(calls, 64, "tree")


def _sweep_rows(steps_ms, comm_ms=None):
    """Rows of a step_time_sweep: {method: {rate: step ms}} and the exchanges' closed forms
    {method: {rate: ms}} (0 where not given)."""
    comm_ms = comm_ms or {}
    rows = [{"method": m, "rate_mbit": q, "step_s": t / 1e3,
             "predicted_comm_s": comm_ms.get(m, {}).get(q, 0.0) / 1e3}
            for m, by_rate in steps_ms.items() for q, t in by_rate.items()]
    return compression.fit_compute(rows)


def test_sweep_stats_says_cannot_tell_inside_the_noise_band():
    X = "powersgd:1"  # any method the break-even knows
    rates = (10, 20, 40, 80, 160)
    noise = (0.0, 1.0, -1.0, 0.5, -0.5)  # ms, the same for both methods
    st = compression.sweep_stats(_sweep_rows({
        "none": {q: 50 + e for q, e in zip(rates, noise)},
        X: {q: 30 + e for q, e in zip(rates, noise)}}))
    assert st.slow == 10 and st.fast == 160
    assert st.band(X) == st.band("none") > 0
    assert all(st.verdict(X, q) == "faster" for q in rates)
    assert st.speedup(X, 10) == pytest.approx(50 / 30)
    assert st.extra_s(X) == 0.0 and st.extra_s("none") == 0.0
    assert st.prediction_errors().max() < 0.05
    # one constant per method: the median residual
    assert st.table["none", 10]["compute_s"] == pytest.approx(0.050)
    wide = compression.sweep_stats(_sweep_rows({
        "none": {q: 50 + 30 * e for q, e in zip(rates, noise)},
        X: {q: 47 + 30 * e for q, e in zip(rates, noise)}}))
    assert all(wide.verdict(X, q) == "cannot tell" for q in rates)
    assert wide.crossing(X) == (None, None, False)
    # x's closed form says it costs 40 ms more from 80 Mbit/s on: it pays below, loses above
    comm = {X: {10: 0.0, 20: 0.0, 40: 0.0, 80: 40.0, 160: 40.0}}
    steps = {"none": dict.fromkeys(rates, 50.0), X: {q: 30.0 + comm[X][q] for q in rates}}
    clean = compression.sweep_stats(_sweep_rows(steps, comm))
    assert clean.crossing(X) == (40, 80, False)
    assert clean.breakeven_mbit(X, 4, 1e-3)[0] <= clean.breakeven_mbit(X, 4, 1e-3)[2]
    steps[X][20] += 40.0  # one disturbed rate: slower there than at 40 Mbit/s
    assert compression.sweep_stats(_sweep_rows(steps, comm)).crossing(X) == (None, None, True)
    with pytest.raises(ValueError, match="rows"):
        compression.sweep_stats(_sweep_rows({X: {10: 1.0}}))

class _LoopbackMeter:
    """All-gather on one rank: hands back the payload, as a completed future."""

    def __init__(self):
        self.calls = []

    def all_gather(self, outputs, tensor, group=None):
        import torch

        self.calls.append(("allgather", tensor.numel() * tensor.element_size()))
        outputs[0].copy_(tensor)
        fut = torch.futures.Future()
        fut.set_result(outputs)
        return fut


class _Bucket:
    """DDP's GradBucket as a hook sees it: a flat buffer holding `params`' gradients one
    after another, in that order (one parameter of the buffer's size by default)."""

    def __init__(self, t, params=None):
        import torch

        self.t = t
        self.params = params if params is not None else [torch.nn.Parameter(torch.zeros_like(t))]

    def buffer(self):
        return self.t

    def index(self):
        return 0

    def parameters(self):
        return self.params


def test_topk_error_feedback_sends_everything_eventually(monkeypatch):
    import torch

    monkeypatch.setattr(compression, "_world", lambda: 1)
    g = torch.tensor([4.0, 1.0, 0.5, -0.25])
    ef = compression.TopK(0.25, _LoopbackMeter())
    noef = compression.TopK(0.25, _LoopbackMeter(), error_feedback=False)
    params = [torch.nn.Parameter(torch.zeros(4))]
    applied_ef, applied_noef = torch.zeros(4), torch.zeros(4)
    for _ in range(40):
        applied_ef += ef(_Bucket(g.clone(), params)).wait()
        applied_noef += noef(_Bucket(g.clone())).wait()
    # with the residual, what was applied plus what is still held is exactly the sum of g
    assert torch.allclose(applied_ef + ef.residual(_Bucket(g, params)), 40 * g)
    assert (applied_ef != 0).all(), "every coordinate was sent at some step"
    assert (applied_noef[1:] == 0).all(), "without it, only the largest ever is"
    assert ef.meter.calls == [("allgather", 8)] * 40  # one value + one index per step


def test_topk_residual_follows_its_parameters_when_ddp_reorders_the_bucket(monkeypatch):
    # DDP rebuilds its buckets after the first step in backward order: [a, b] becomes [b, a]
    import torch

    monkeypatch.setattr(compression, "_world", lambda: 1)
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    ga, gb = torch.tensor([8.0, 1.0, 2.0]), torch.tensor([5.0, -0.5])
    ef = compression.TopK(0.2, _LoopbackMeter())  # k = 1 of 5
    sent = ef(_Bucket(torch.cat([ga, gb]), [a, b])).wait()  # step 0: sends a[0]
    assert torch.equal(sent, torch.tensor([8.0, 0, 0, 0, 0]))
    assert torch.equal(ef.residuals[a], torch.tensor([0.0, 1.0, 2.0]))
    assert torch.equal(ef.residuals[b], gb)
    sent = ef(_Bucket(torch.cat([gb, ga]), [b, a])).wait()  # step 1, rebuilt: b first
    # b's entries now come first: its residual is added to them (b[0] = 5 + 5 is sent), not
    # to a's old place (a residual kept by position would send 8 + 2 at position 2)
    assert torch.equal(sent, torch.tensor([10.0, 0, 0, 0, 0]))
    assert torch.equal(ef.residual(_Bucket(torch.zeros(5), [a, b])),
                       torch.tensor([8.0, 2.0, 4.0, 0.0, -1.0]))
    with pytest.raises(RuntimeError, match="entries"):
        ef(_Bucket(torch.zeros(4), [a, b]))


def test_hooks_through_netem_send_what_the_shapes_predict():
    rows = compression.bytes_table(("none", "fp16", "bf16", "powersgd:2", "topk:0.05"), nodes=2,
                                   nic="delay 500us")
    for r in rows:
        assert r["measured_calls"] == r["predicted_calls"], r["method"]
        assert r["replicas_identical"], r["method"]
        assert r["sent_bytes"] == pytest.approx(r["predicted_sent_bytes"])
    sent = {r["method"]: r["sent_bytes"] for r in rows}
    assert sent["fp16"] == sent["bf16"] == sent["none"] / 2
    assert sent["powersgd:2"] < sent["topk:0.05"] < sent["fp16"]


def test_run_options_are_checked():
    from clusterlab import Cluster

    cl = Cluster(2, nic="delay 1ms")  # never started: the checks come first
    with pytest.raises(TypeError, match="unknown option"):
        compression.run_method(cl, method="none", speed=3)
    with pytest.raises(ValueError, match="steps"):
        compression.run_method(cl, method="none", steps=2)
    with pytest.raises(ValueError, match="unknown method"):
        compression.run_method(cl, method="zip")
    cl.close()


def _matmul_after_a_relayed_all_reduce():
    """test_backend's matmul_probe in a callback chained on a _Meter's all-reduce (as PowerSGD
    chains its steps)."""
    import torch
    from test_backend import matmul_probe

    product = matmul_probe()
    fut = compression._Meter().all_reduce(torch.ones(1), async_op=True).get_future()
    return fut.then(product).wait()  # chained at once: the 20 ms all-reduce is not done yet


def test_the_meters_relay_threads_compute_as_the_caller_does():
    # The replicas of powersgd:2 ended ulps apart in ~3 runs in 8: its decompressing matmul
    # ran with 1 MKL thread on a rank whose callbacks ran in the caller's thread, with every
    # core on a rank whose ran in a relay thread (torch.set_num_threads is per thread there).
    from clusterlab import Cluster

    with Cluster(nodes=2, nic="delay 20ms", threads=1, timeout=60) as cl:
        out = cl.run(_matmul_after_a_relayed_all_reduce)
    for thread, same in out:
        assert thread != "MainThread"
        assert same, out
