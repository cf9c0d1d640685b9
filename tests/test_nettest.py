"""`clusterlab nettest`: its numbers match a configured network within the fidelity targets,
its outlier report names the slow link, and its JSON calibrates the simulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clusterlab import Cluster, models, nettest, sim
from clusterlab.doctor import MEDIAN_DELAY_TOLERANCE
from clusterlab.netem import Netem
from clusterlab.wire import wire_beta

pytestmark = pytest.mark.timeout(150)

GOODPUT_TOLERANCE = 0.05  # the fidelity bench's goodput target (goodput / rate in 0.95..1.05)


def _synthetic(slow=(1, 2), world=3, delay_ns=1_000_000, bw=1e8, slow_bw=1e7):
    rng = np.random.default_rng(0)
    opts = nettest.Options(ping_iters=20, bw_bytes=1 << 20, sizes=(1024, 4096))
    latency = {(a, b): list(delay_ns + rng.integers(0, 5000, 20))
               for a in range(world) for b in range(a + 1, world)}
    rtt = 2 * delay_ns
    bandwidth = {(s, d): [int(rtt + (1 << 20) / (slow_bw if (s, d) == slow else bw) * 1e9)] * 3
                 for s in range(world) for d in range(world) if s != d}
    rows = [{"collective": "all_reduce", "bytes": n, "ranks": world, "time_s": 1e-3 + n / bw,
             "algbw": 0.0, "busbw": 0.0} for n in (1024, 4096)]
    return nettest.summarize(latency, bandwidth, rows, world=world,
                             hosts=[f"h{r}" for r in range(world)],
                             procs_per_node=1, backend="gloo", opts=opts)


def test_outliers_name_the_slow_link_and_calibrate_the_simulator():
    result = _synthetic()
    named = [o["what"] for o in result["outliers"]]
    assert named == ["link 1->2"], named
    bw = {(ln["src"], ln["dst"]): ln["bandwidth_Bps"] for ln in result["links"]}
    assert bw[(0, 1)] == pytest.approx(1e8, rel=1e-3)  # the round trip is subtracted
    # A rank whose every link is slow is named itself.
    five = _synthetic(world=5)
    slow_rank = nettest.outliers({**five, "links": [
        {**ln, "bandwidth_Bps": ln["bandwidth_Bps"] / (10 if 0 in (ln["src"], ln["dst"]) else 1)}
        for ln in five["links"] if (ln["src"], ln["dst"]) != (1, 2)]})
    assert [o["what"] for o in slow_rank if not o["what"].startswith("link")] == [
        "rank 0", "host h0"]
    cal = nettest.load_calibration(json.loads(json.dumps(result)))
    assert cal.nic.delay_ns == pytest.approx(1.0025e6, rel=0.01)
    assert 1 / wire_beta(cal.nic.rate_bps) == pytest.approx(1e8, rel=0.01)  # payload rate
    assert cal.topology().world_size == 3
    out = sim.simulate_training(cal.nodes, cal.procs_per_node, nic=cal.nic, intra=cal.intra,
                                model_bytes=1e6, steps=2)
    assert out.mean_step > 0
    from clusterlab.step_model import TrainingSetup  # what the throughput explorer takes

    setup = TrainingSetup(nodes=64, **cal.explorer_settings())
    assert setup.spec.delay_ns == pytest.approx(cal.nic.delay_ns, rel=1e-3)
    assert setup.spec.rate_bps == pytest.approx(cal.nic.rate_bps, rel=1e-3)
    assert "OUTLIER (bandwidth): link 1->2" in nettest.table(result)
    with pytest.raises(ValueError, match="nettest result"):
        nettest.load_calibration({"world": 2})
    with pytest.raises(ValueError, match="ping_iters"):
        nettest.Options(ping_iters=0)
    with pytest.raises(ValueError, match="collectives"):
        nettest.Options(collectives=("allreduce",))


def test_command_line_errors_name_the_option(capsys):
    for argv, name in ((["--iters", "0"], "ping_iters"), (["--sizes", "1k"], "--sizes"),
                       (["--nproc-per-node", "1"], "--nproc-per-node"),
                       (["--timeout", "0"], "--timeout")):
        with pytest.MonkeyPatch.context() as mp:
            for var in ("RANK", "WORLD_SIZE"):
                mp.delenv(var, raising=False)
            with pytest.raises(SystemExit) as exc:
                nettest.main(argv)
        assert exc.value.code == 2 and name in capsys.readouterr().err


def _measure_small():
    return nettest.measure(nettest.Options(ping_iters=20, bw_bytes=1 << 16, bw_reps=2,
                                           sizes=(4096, 65536), coll_iters=2, warmup=1))


def test_plain_gloo_on_loopback(no_leftovers):
    with Cluster(nodes=2, nic=None, timeout=60) as cl:
        result = cl.run(_measure_small)[0]
    assert result["backend"] == "gloo" and result["configured"] is None
    assert len(result["pairs"]) == 1 and len(result["links"]) == 2
    assert result["pairs"][0]["samples"] == 20 and result["pairs"][0]["p50_us"] > 0
    assert {r["collective"] for r in result["collectives"]} == set(nettest.COLLECTIVES)
    for r in result["collectives"]:
        assert r["busbw"] == pytest.approx(r["algbw"] * models.busbw_factor(r["collective"], 2))


def test_nettest_under_torchrun_matches_the_configured_network(tmp_path, no_leftovers):
    """2 ranks under torchrun on "netem": 5 ms, 200 Mbit/s NICs, and link 1->0 at 50 Mbit/s
    (two ranks: on 2 cores, a third would measure the CPU it waits for)."""
    out = tmp_path / "cluster.json"
    png = tmp_path / "cluster.png"
    env = {**os.environ, "CLUSTERLAB_NIC": "delay 5ms rate 200mbit",
           "CLUSTERLAB_LINKS": "1->0=delay 5ms rate 50mbit", "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "clusterlab", "nettest", "--nproc-per-node", "2",
           "--iters", "60", "--bw-bytes", str(1 << 20), "--bw-reps", "3",
           "--sizes", "65536", "--coll-iters", "2", "-o", str(out), "--png", str(png)]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.returncode == 0, text[-3000:]
    result = json.loads(out.read_text())
    assert png.stat().st_size > 10_000
    assert result["backend"] == "netem" and result["configured"]["CLUSTERLAB_NIC"]
    # The fidelity bench's delay target, on both directions' p50 (60 samples each; a busy
    # machine makes single ones late, never early).
    p50 = np.array([ln["one_way"]["p50_us"] for ln in result["links"]])
    assert abs(np.median(p50) / 5000 - 1) <= MEDIAN_DELAY_TOLERANCE, p50
    assert np.all(p50 / 5000 - 1 >= -MEDIAN_DELAY_TOLERANCE), p50
    for p in result["pairs"]:  # a round trip adds the responder's turnaround, never less
        assert p["p50_us"] >= 5000 * (1 - MEDIAN_DELAY_TOLERANCE), p
    rate = {(ln["src"], ln["dst"]): ln["bandwidth_Bps"] for ln in result["links"]}
    payload = {k: 1 / wire_beta(Netem.parse("rate 50mbit" if k == (1, 0) else
                                            "rate 200mbit").rate_bps) for k in rate}
    ratios = {k: rate[k] / payload[k] for k in rate}
    assert all(abs(r - 1) <= GOODPUT_TOLERANCE for r in ratios.values()), ratios
    assert [o["what"] for o in result["outliers"]] == ["link 1->0"], result["outliers"]
    assert "OUTLIER (bandwidth): link 1->0" in text
    cal = nettest.load_calibration(out)
    assert abs(cal.nic.delay_ns / 5e6 - 1) <= MEDIAN_DELAY_TOLERANCE


BAD_NIC = "delay 2ms lossy 1%"


def test_network_error_names_the_variable_its_value_and_what_it_accepts():
    line = nettest.network_error(2, {"CLUSTERLAB_NIC": BAD_NIC})
    assert line.startswith(f"CLUSTERLAB_NIC={BAD_NIC!r}: ") and "expected one of" in line
    assert "\n" not in line and "loss" in line
    assert nettest.network_error(2, {"CLUSTERLAB_NIC": "delay 2ms loss 1%"}) is None
    assert "does not divide" in nettest.network_error(
        2, {"CLUSTERLAB_NIC": "delay 1ms", "CLUSTERLAB_PROCS_PER_NODE": "3"})


def _nettest(argv, tmp_path, **env):
    """`python -m <argv>` with this checkout first on the path, under a timeout."""
    checkout = str(Path(nettest.__file__).resolve().parents[1])
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **env,
           "PYTHONPATH": os.pathsep.join([checkout, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", *argv], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode, out, err


def test_a_bad_nic_is_one_line_before_any_rank_starts(tmp_path):
    code, out, err = _nettest(["clusterlab", "nettest", "--nproc-per-node", "2"], tmp_path,
                              CLUSTERLAB_NIC=BAD_NIC)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and out == "", (out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"clusterlab nettest: error: CLUSTERLAB_NIC={BAD_NIC!r}: ")
    assert "expected one of" in lines[0]
    assert not list(tmp_path.iterdir())  # no rank ran: no JSON, no figure


@pytest.mark.parametrize("local_rank, says", [("0", True), ("1", False)])
def test_under_the_users_torchrun_a_bad_nic_ends_each_rank_with_one_line(tmp_path, local_rank,
                                                                        says):
    """A rank as torchrun starts it: it exits 2 before joining the group (no peer to wait for),
    with no traceback; only each host's first rank says why."""
    code, out, err = _nettest(["clusterlab.nettest"], tmp_path, CLUSTERLAB_NIC=BAD_NIC,
                              RANK=local_rank, LOCAL_RANK=local_rank, WORLD_SIZE="2",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == (1 if says else 0), err
    assert not says or lines[0].startswith(f"clusterlab nettest: error: CLUSTERLAB_NIC={BAD_NIC!r}")
