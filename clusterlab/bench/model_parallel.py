"""The model bench's rows for sharded and model-parallel training (`clusterlab.parallelism`).

Each row runs one experiment of notebook 10 (`clusterlab.experiments.parallelism`) on real
ranks through the netem backend and sets it against its closed form or replay:

1. bytes per rank per step, counted by the backend, for DDP, ZeRO-1, ZeRO-2, FSDP2 (ZeRO-3)
   and FSDP2 without resharding, against `parallelism.sharded_traffic` (exact);
2. how much a step grows from 1 ms to 10 ms of one-way latency for DDP, FSDP2 and
   Megatron-style tensor parallelism, against the closed forms' growth (what a step costs
   beyond the network, the same at both latencies, cancels out), dilated;
3. GPipe and 1F1B steps on 4 stage processes against the replay over the same link model
   (fed the operations' measured durations);
4. one MoE layer with a hot expert against the closed form (busiest sender, hot expert's
   compute, hot rank's combine);
5. an all-to-all under jitter against the order statistic E[max of N(N-1) draws]: the
   prediction must lie between the two measured bounds (from the first and from the last
   rank's entry), within the tolerance, dilated.
"""

from __future__ import annotations

from .. import parallelism as par
from ..experiments import parallelism as exp
from . import check, tick

TOLERANCE = 0.15
# The latency rows and the all-to-alls run this many times slower than the network they
# emulate: this machine's own per-message costs (wake-ups on 2 shared cores) shrink k-fold.
DILATION = 3


def _rel(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas if meas else float("inf")


def parallel_rows(rows: list[dict], checks: list[dict], quick: bool = False) -> None:
    """Append this family's rows and checks to the model bench's."""
    traffic = exp.sharded_traffic(ranks=4, width=64, depth=3, nic="delay 1ms")
    for strategy in exp.SHARDED:
        t = traffic[strategy]
        measured = t["by_kind"]["allreduce"] if strategy == "ddp" else t["sent"][0]
        tick()
        rows.append({"kind": "sharded_bytes", "strategy": strategy, "ranks": 4,
                     "params": traffic["params"], "sent": t["sent"], "by_kind": t["by_kind"],
                     "predicted": t["predicted"]})
        exact = all(s == t["predicted"] for s in t["sent"]) if strategy != "ddp" else \
            measured == t["predicted"]
        what = "gradient all-reduce" if strategy == "ddp" else "all"
        checks.append(check(f"{strategy}: bytes sent per rank per step ({what}), 4 ranks, "
                            "backend counters vs closed form", "equal", measured, exact))

    sweep = exp.step_time_sweep(["delay 1ms", "delay 10ms"], ranks=2, steps=5 if quick else 8,
                                dilation=DILATION)
    lo, hi = sweep
    tick()
    rows.append({"kind": "parallel_latency", "rows": sweep})
    for kind, label in (("ddp", "DDP"), ("fsdp", "FSDP2, 3 layers"),
                        ("tp", "tensor parallel, 4 MLP blocks")):
        grow = hi[f"{kind}_s"] - lo[f"{kind}_s"]
        pred = hi[f"{kind}_comm_s"] - lo[f"{kind}_comm_s"]
        err = _rel(pred, grow)
        checks.append(check(f"{label}, 2 ranks: step growth from delay 1ms to 10ms vs closed "
                            "form", f"relative error <= {TOLERANCE}", round(err, 4),
                            err <= TOLERANCE))

    nics = ["delay 100us", "delay 10ms 5ms"][: 1 if quick else 2]
    for r in exp.pipeline(nics):
        tick()
        rows.append({"kind": "pipeline", **{k: v for k, v in r.items() if k != "ops"}})
        err = _rel(r["simulated_step_s"], r["step_s"])
        checks.append(check(f"{r['schedule']} step, 4 stages, 8 micro-batches, {r['nic']}: "
                            "replay vs measured", f"relative error <= {TOLERANCE}",
                            round(err, 4), err <= TOLERANCE))

    for r in exp.moe_alltoall(hot_shares=(0.25, 0.75) if quick else (0.25, 0.5, 0.75)):
        tick()
        rows.append({"kind": "moe", **r})
        err = _rel(r["predicted_step_s"], r["step_s"])
        checks.append(check(f"MoE layer, 4 ranks, hot expert share {r['hot_share']:.2f}: "
                            "closed form vs measured", f"relative error <= {TOLERANCE}",
                            round(err, 4), err <= TOLERANCE))

    for r in exp.alltoall_growth(ranks=(2, 4) if quick else (2, 3, 4), dilation=DILATION):
        tick()
        rows.append({"kind": "alltoall_jitter", **r})
        low, high = r["last_entry_mean_s"], r["mean_s"]
        pred = r["predicted_s"]
        miss = max(0.0, (low - pred) / pred, (pred - high) / pred)
        checks.append(check(f"all_to_all, {r['ranks']} ranks, delay 10ms 2ms normal: "
                            "E[max of N(N-1)] between the measured bounds", f"outside by <= "
                            f"{TOLERANCE}", round(miss, 4), miss <= TOLERANCE))
        checks.append(check(f"all_to_all, {r['ranks']} ranks: replay vs order statistic",
                            "relative error <= 0.05", round(_rel(r["simulated_s"], pred), 4),
                            _rel(r["simulated_s"], pred) <= 0.05))
    big = par.alltoall_seconds(ranks=1024, delay_s=0.01, jitter_s=0.002,
                               distribution="normal", last_rank=True)
    tick()
    rows.append({"kind": "alltoall_1024", "predicted_s": big})
