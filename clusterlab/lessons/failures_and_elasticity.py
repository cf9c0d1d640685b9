"""What notebook 12 reads from its runs: a restart, the checkpoint interval, goodput, hangs,
checkpoint stalls.

The runs are `clusterlab.experiments.failures`'s (a torchrun job object, plain dicts); here
they become the sentences, the figures and the checks that the run showed what the text says,
each measured comparison passed to `conclude`.
"""

from __future__ import annotations

import re

from .. import models
from ..experiments.common import conclude
from . import show


def explain_restart(job) -> None:
    """Print what the first job did: its exit, attempts and leftover processes, where rank 1
    died and where the new group resumed, the restart's and redone work's seconds beside a
    step and a checkpoint (medians)."""
    s = job.summary()
    f = job.failures()[0]
    print(f"exit code {job.returncode}, {job.attempts} attempts, {s['steps']} steps; "
          f"processes of the job left after it: {len(job.leftover)}")
    print(f"rank 1 died at step {f['step']}; the new group resumed from step {f['resumed_from']} "
          f"and redid {f['redone_steps']} steps")
    print(f"restart (from the SIGKILL until the new group had loaded the checkpoint): "
          f"{f['restart_s']:.2f} s; "
          f"redone work {f['redo_s']:.2f} s; a step {s['step_s'] * 1e3:.0f} ms (median of "
          f"{len(job.step_seconds())}), a checkpoint {s['checkpoint_s'] * 1e3:.0f} ms (median of "
          f"{s['checkpoints']})")
    print(f"of the failure's cost (restart + redone work), the restart was "
          f"{f['restart_s'] / (f['restart_s'] + f['redo_s']):.0%} on this toy job")


def check_restart(job) -> None:
    """Assert what the text says of the first job: it ended cleanly after one restart, resumed
    from the step-8 checkpoint redoing 2 steps, and the restart cost far more than a step."""
    s = job.summary()
    f = job.failures()[0]
    assert job.returncode == 0 and job.attempts == 2 and not job.leftover
    assert f["resumed_from"] == 8 and f["redone_steps"] == 2
    assert f["restart_s"] > 10 * s["step_s"], "a restart costs far more than a step"


def plot_restart(job) -> None:
    """Draw the first job's timeline (`job.plot_timeline`) with the restart shaded and
    labelled, the redone steps circled, and the checkpoints' steps named in the legend."""
    import matplotlib.pyplot as plt

    f = job.failures()[0]
    kill = next(e for e in job.events if e["kind"] == "kill")
    t_kill = kill["t"] / 1e9 - job.first_s
    ax = job.plot_timeline(title=f"torchrun, {job.config['nodes']} workers: rank "
                           f"{kill['rank']} killed at step {kill['step']}")
    ax.axvspan(t_kill, t_kill + f["restart_s"], color="red", alpha=0.08,
               label=f"restart {f['restart_s']:.2f} s")
    redone = [e for e in job.events if e["kind"] == "step" and e["rank"] == 0
              and e["attempt"] == kill["attempt"] + 1 and e["step"] <= f["step"]]
    ax.plot([e["t"] / 1e9 - job.first_s for e in redone], [e["step"] for e in redone], "o",
            mfc="none", mec="black", ms=9,
            label=f"redone: steps {f['resumed_from'] + 1} to {f['step']}")
    saved = sorted({e["step"] for e in job.events if e["kind"] == "checkpoint"})
    ax.plot([], [], color="grey", lw=0.5, ls=":",
            label="checkpoints at steps " + ", ".join(str(k) for k in saved))
    ax.legend(fontsize=8, loc="lower right")
    plt.tight_layout()
    plt.show()


def waste_curve(*, checkpoint_s: float, mtbf_s: float, restart_s: float, points: int = 60):
    """(intervals in s, expected waste at each): the first-order waste over intervals from
    2 minutes to M/2 (beyond that tau is not far below M and the first-order model stops
    holding), for the figure and the check that Young's interval is its minimum."""
    import numpy as np

    taus = np.geomspace(120.0, mtbf_s / 2, points)
    return taus, [models.checkpoint_waste(t, checkpoint_s, mtbf_s, restart_s) for t in taus]


def plot_waste(*, checkpoint_s: float, mtbf_s: float, restart_s: float) -> None:
    """Draw the expected waste against the checkpoint interval (minutes, log scale), Young's
    interval marked."""
    import matplotlib.pyplot as plt
    import numpy as np

    tau_star = models.young_daly_interval(checkpoint_s, mtbf_s)
    taus, waste = waste_curve(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s, restart_s=restart_s)
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.plot(taus / 60, np.array(waste) * 100)
    ax.axvline(tau_star / 60, color="C3", ls="--", label=f"Young: {tau_star / 60:.0f} min")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes of work)")
    ax.set_ylabel("expected waste (%)")
    ax.legend()
    ax.set_title(f"C = {checkpoint_s:.0f} s, MTBF = {mtbf_s / 3600:.0f} h, "
                 f"restart = {restart_s / 60:.0f} min")
    plt.tight_layout()
    plt.show()


def young_lines(*, checkpoint_s: float, mtbf_s: float, restart_s: float) -> list[str]:
    """Young's interval in words, checked: its waste and the restarts' share (asserted the
    curve's minimum), the waste at half and twice the interval, and checkpoints 4x faster
    (asserted: the interval's part of the waste halves, the total falls by less than half)."""
    tau_star = models.young_daly_interval(checkpoint_s, mtbf_s)
    _, waste = waste_curve(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s, restart_s=restart_s)
    best = models.checkpoint_waste(tau_star, checkpoint_s, mtbf_s, restart_s)
    lines = [f"Young's interval {tau_star:.0f} s; expected waste there {best:.1%}, of which the "
             f"restarts alone are {restart_s / mtbf_s:.1%}"]
    assert all(w >= best - 1e-12 for w in waste)
    half, double = (models.checkpoint_waste(k * tau_star, checkpoint_s, mtbf_s, restart_s)
                    for k in (0.5, 2))
    lines.append(f"flat near the minimum: waste {half:.1%} at half that interval, {double:.1%} "
                 f"at twice it")
    tau4 = models.young_daly_interval(checkpoint_s / 4, mtbf_s)
    best4 = models.checkpoint_waste(tau4, checkpoint_s / 4, mtbf_s, restart_s)
    part, part4 = best - restart_s / mtbf_s, best4 - restart_s / mtbf_s
    lines.append(f"checkpoints 4x faster: interval {tau4:.0f} s, waste {best4:.1%}: the "
                 f"interval's part went from {part:.1%} to {part4:.1%} (halved), the restarts' "
                 f"{restart_s / mtbf_s:.1%} stayed")
    assert abs(part4 / part - 0.5) < 1e-9 and best4 > best / 2
    lines.append(f"per failure, on average: half an interval, {tau_star / 2:.0f} s of redone "
                 f"work, against the restart's {restart_s:.0f} s: at this scale "
                 + ("the two are comparable" if 0.5 < tau_star / 2 / restart_s < 2 else
                    "the restart dominates" if tau_star / 2 < restart_s else
                    "the redone work dominates"))
    return lines


def explain_young(*, checkpoint_s: float, mtbf_s: float, restart_s: float) -> None:
    """Print `young_lines(...)`: Young's interval, how flat the waste is near it, and what
    4x faster checkpoints change."""
    for line in young_lines(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s, restart_s=restart_s):
        print(line)


def schedule_line(schedule: list[int], *, first: dict, failure: dict, mtbf_steps: int,
                  tau: float, interval: int, predicted: float) -> str:
    """The second job's plan in words: its failure steps, its MTBF in seconds of work and
    whether that is shorter or longer than one restart (when shorter: outside Young's regime,
    where its interval is only a rule of thumb), and Young's interval in ms and steps."""
    mtbf_run = mtbf_steps * first["step_s"]
    short = mtbf_run < failure["restart_s"]
    return (f"failures at steps {schedule} (at most 2 drawn); MTBF {mtbf_steps} steps = "
            f"{mtbf_run:.2f} s of work, "
            f"{'shorter' if short else 'longer'} than one restart "
            f"({failure['restart_s']:.2f} s)"
            + (f": outside Young's regime (it needs the interval and the restart far below "
               f"the MTBF), so Young's interval, {tau * 1e3:.0f} ms = {interval} steps, is only "
               "a rule of thumb here" if short else
               f"; Young's interval {tau * 1e3:.0f} ms = {interval} steps"))


def explain_schedule(schedule: list[int], *, first: dict, failure: dict, mtbf_steps: int,
                     tau: float, interval: int, predicted: float) -> None:
    """Show `schedule_line(...)` behind a fold (bookkeeping of the estimate, not the lesson)
    and assert the drawn schedule has a failure."""
    from . import show

    assert schedule, "the drawn schedule has at least one failure"
    show.fold("The second job's plan: its failures, its MTBF against one restart, Young's "
              "interval",
              schedule_line(schedule, first=first, failure=failure, mtbf_steps=mtbf_steps,
                            tau=tau, interval=interval, predicted=predicted))


def explain_goodput(job2, *, first: dict, ideal: float, schedule: list[int]) -> None:
    """Print the second job's goodput against the bare step rate and the share of its time
    that was useful work: of its training time (from the first worker's first event, after its
    torch import) and of torchrun's whole run (with its start-up, that import and the exit);
    assert it ended cleanly with every scheduled failure, and that its restarts outweigh what
    the interval controls (checkpoints and redone steps) 3 to 1."""
    s2 = job2.summary()
    restarts = sum(x["restart_s"] for x in job2.failures())
    interval_part = s2["checkpoints"] * s2["checkpoint_s"] + sum(x["redo_s"]
                                                                 for x in job2.failures())
    print(f"goodput {s2['goodput_steps_per_s'] * first['step_s']:.0%} useful work, of its "
          f"training time (from the first worker's first event): "
          f"{s2['goodput_steps_per_s']:.1f} steps/s against a bare step rate (1 / step time) "
          f"of {1 / first['step_s']:.1f}")
    show.fold("Of torchrun's whole run instead",
              f"{ideal / s2['wall_s']:.0%} of torchrun's whole run, which adds torchrun's "
              "start-up and the workers' first import of torch to the training time.")
    assert job2.returncode == 0 and not job2.leftover and s2["failures"] == len(schedule)
    assert restarts > 3 * interval_part, "restarts, not the interval, dominate this toy job"


def time_parts(job2, *, steps: int) -> tuple[dict, float]:
    """(parts, other): the second job's wall time split into every step once (at its median
    step), start-up, checkpoints, restarts and redone steps, in seconds, plus what lies between
    them ("unaccounted", added to the parts when above 10 ms)."""
    s2 = job2.summary()
    parts = {"steps": steps * s2["step_s"],  # every step once, at the second job's median step
             "start-up": s2["startup_s"], "checkpoints": s2["checkpoints"] * s2["checkpoint_s"],
             "restarts": sum(x["restart_s"] for x in job2.failures()),
             "redone steps": sum(x["redo_s"] for x in job2.failures())}
    other = s2["train_s"] - sum(parts.values())  # time between the parts, e.g. the last step's end
    if other > 0.01:
        parts["unaccounted"] = other
    return parts, other


def plot_parts(parts: dict) -> None:
    """Draw the second job's training time as one stacked bar of its parts (summed, not in
    time order)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 2.2))
    left = 0.0
    for i, (name, v) in enumerate(parts.items()):
        ax.barh(0, v, left=left, color=f"C{i}" if name != "unaccounted" else "lightgrey",
                label=f"{name} {v:.2f} s" + (" (count x median)" if name in ("steps",
                                                                          "checkpoints") else ""))
        left += v
    ax.set_yticks([])
    ax.set_xlabel("seconds of the second job")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_title("Where the second job's training time went (parts summed, not in time order)")
    plt.tight_layout()
    plt.show()


def estimate_rows(*, first: dict, failure: dict, parts: dict, other: float,
                  schedule: list[int], steps: int, interval: int) -> list[tuple[str, float, float]]:
    """(part, estimate, measured) in seconds: the terms of `failures.predicted_train_s`, from
    the first job (medians of its steps and checkpoints, its one start-up and one restart),
    beside the second job's measured parts; "unaccounted" is what lies between them."""
    redone_est = sum(x - (x // interval) * interval for x in schedule)
    return [("start-up", first["startup_s"], parts["start-up"]),
            ("steps", steps * first["step_s"], parts["steps"]),
            ("checkpoints", (steps - 1) // interval * first["checkpoint_s"], parts["checkpoints"]),
            ("restarts", len(schedule) * failure["restart_s"], parts["restarts"]),
            ("redone steps", redone_est * first["step_s"], parts["redone steps"]),
            ("unaccounted", 0.0, other)]


def estimate_lines(rows: list[tuple[str, float, float]], *, predicted: float,
                   train_s: float) -> list[str]:
    """The estimate against the measurement, part by part, in words: a table with the total,
    then by how much the total missed, the row that missed most, whether misses of opposite
    sign cancelled (the smaller sign's sum over 50 ms and over a quarter of the larger's) or
    mostly added up, and whether the total held within 10%."""
    lines = [f"{'part (s)':14s}{'estimate':>10s}{'second job':>12s}{'difference':>12s}"]
    for name, est, got in rows:
        mark = "*" if name in ("steps", "checkpoints") else ""
        lines.append(f"{name + mark:14s}{est:10.2f}{got:12.2f}{got - est:+12.2f}")
    miss = train_s - predicted
    lines.append(f"{'total':14s}{predicted:10.2f}{train_s:12.2f}{miss:+12.2f}")
    if any(name in ("steps", "checkpoints") for name, _, _ in rows):
        lines.append("* count x median in both columns, not a measured sum: the steps' spread "
                     "around their median falls in unaccounted")
    diffs = {name: got - est for name, est, got in rows}
    worst = max(diffs, key=lambda k: abs(diffs[k]))
    over = sum(d for d in diffs.values() if d > 0)  # measured above the estimate
    under = -sum(d for d in diffs.values() if d < 0)  # measured below it
    cancelled = min(over, under)  # what misses of opposite sign took off each other
    balanced = cancelled > 0.25 * max(over, under)  # neither sign's sum dwarfs the other's
    lines.append(f"the estimate missed by {miss / predicted:+.0%}; the largest difference is in "
                 f"the {worst} row ({diffs[worst]:+.2f} s)"
                 + (f"; misses of opposite sign offset {cancelled:.2f} s of each other "
                    f"({over:+.2f} s against {-under:+.2f} s)" if balanced and cancelled > 0.05
                    else f"; the rows' misses were mostly of one sign ({over:+.2f} s against "
                    f"{-under:+.2f} s), so they added up" if not balanced and over + under > 0.05
                    else ""))
    lines.append("the total held within 10% on this run (one run does not validate it)"
                 if abs(miss) < 0.1 * predicted else "the total missed by over 10% on this run")
    return lines


def compare_estimate(rows: list[tuple[str, float, float]], *, predicted: float, second: dict,
                     other: float) -> None:
    """Print `estimate_lines(...)`. Asserted silently: the estimate's rows add up to it, and
    the measured parts leave under 10% of the job's time unaccounted (an accounting check,
    not a finding: start-up, restarts and redone steps are intervals of the event log that
    defines that time, steps and checkpoints its counts times their medians)."""
    assert abs(sum(r[1] for r in rows) - predicted) < 1e-6
    assert abs(other) < 0.1 * second["train_s"], "the measured parts account for the job's time"
    from . import show

    lines = estimate_lines(rows, predicted=predicted, train_s=second["train_s"])
    lead = next(i for i, line in enumerate(lines) if line.startswith("the estimate missed"))
    print("In short: " + lines[lead].split("; the rows'")[0].split("; misses of")[0] + ".")
    worst = max(rows, key=lambda r: abs(r[2] - r[1]))
    shown = {worst[0], "restarts", "total"}  # the row the headline names, always
    table = lines[:len(rows) + 2]  # header, rows (named in their first 14 characters), total
    for line in table[:1] + [line for line in table[1:] if line[:14].strip(" *") in shown]:
        print(line)
    print(f"{worst[0]}: the first job's {worst[1]:.2f} s against the second's {worst[2]:.2f} s. "
          + HOLDS.get(worst[0], ""))
    show.fold("Every part of the estimate, and whether the parts' misses cancelled",
              "\n".join(lines), pre=True)


def explain_estimate(rows: list[tuple[str, float, float]], *, predicted: float, second: dict,
                     other: float, failure: dict, job2) -> None:
    """One fold for the whole check of the estimate (bookkeeping of how a number was obtained,
    off the main path): the estimate against the
    measured parts row by row (`estimate_lines`), what the row that missed most holds, and
    every restart measured (`restart_miss_lines`). Asserted silently, as in
    `compare_estimate`: the rows add up to the estimate and under 10% of the job's time is
    unaccounted."""
    from . import show

    assert abs(sum(r[1] for r in rows) - predicted) < 1e-6
    assert abs(other) < 0.1 * second["train_s"], "the measured parts account for the job's time"
    lines = estimate_lines(rows, predicted=predicted, train_s=second["train_s"])
    worst = max(rows, key=lambda r: abs(r[2] - r[1]))
    miss = second["train_s"] / predicted - 1
    body = "\n\n".join(
        [f"**Estimate against the second job** ({predicted:.1f} s from the first job's medians, "
         "its one start-up and its one restart):", "```text\n" + "\n".join(lines) + "\n```",
         f"{worst[0]}: the first job's {worst[1]:.2f} s against the second's "
         f"{worst[2]:.2f} s. " + HOLDS.get(worst[0], ""),
         "**Restart by restart.** "
         + "; ".join(restart_miss_lines(failure=failure, job2=job2, predicted=predicted))])
    show.fold(f"Did the first job's costs predict the second's? The estimate missed by "
              f"{miss:+.0%} (one run, not a validation)", body, markdown=True)


# What each part of the estimate holds, said under the table for the part that missed most.
HOLDS = {
    "start-up": "Timed from the first worker's first event, it holds only the other worker's "
                "lag in importing torch and the process-group set-up: one sample of a wait "
                "that varies from run to run.",
    "restarts": "Each restart holds the agent's rendezvous round and new interpreters "
                "importing torch, and the estimate used the first job's one restart for all.",
    "steps": "Count x median in both columns: the steps' spread falls in unaccounted.",
    "checkpoints": "Count x median in both columns.",
    "redone steps": "The steps since the last checkpoint, at the first job's median step.",
    "unaccounted": "Time between the parts, such as the last step's end.",
}


def restart_miss_lines(*, failure: dict, job2, predicted: float) -> list[str]:
    """Every restart measured (in brackets: until the new workers had torch loaded), then how
    far the first job's one restart, which the estimate used for every failure, sat from the
    second job's, and what that made of the restarts row against the total miss."""
    s2 = job2.summary()
    r2 = [x["restart_s"] for x in job2.failures()]
    lines = ["restarts measured (in brackets: until the new workers had torch loaded): first "
             f"job {failure['restart_s']:.2f} s ({failure['respawn_s']:.2f} s), the one the "
             "estimate used; second job "
             + ", ".join(f"{x['restart_s']:.2f} s ({x['respawn_s']:.2f} s)"
                         for x in job2.failures())]
    if r2:
        gap = failure["restart_s"] - sum(r2) / len(r2)
        word = "slower" if gap > 0 else "faster"
        each = (f" (and {word} than each)" if all(failure["restart_s"] > r for r in r2)
                or all(failure["restart_s"] < r for r in r2) else "")
        lines.append(f"the first job's restart was {abs(gap):.2f} s {word} than the second "
                     f"job's mean{each}; over {len(r2)} "
                     f"restarts that makes the restarts row's {-gap * len(r2):+.2f} s, against "
                     f"the total's {s2['train_s'] - predicted:+.2f} s miss")
    return lines


def explain_restart_miss(*, failure: dict, job2, predicted: float) -> None:
    """Show `restart_miss_lines(...)` behind a fold."""
    from . import show

    show.fold("Restart by restart: how far the one the estimate used sat from the others",
              "\n".join(restart_miss_lines(failure=failure, job2=job2, predicted=predicted)))


def explain_hung(hung: list[dict]) -> tuple[float, int]:
    """Print how long ranks 0 and 1 waited at each timeout and what rank 0 was told; assert
    each wait ended within 0.5 s after its timeout and that no error names rank 2; print and
    return (the largest overshoot past a timeout in s, the number of waits)."""
    for r in hung:
        print(f"timeout {r['timeout_s']:.1f} s: ranks 0 and 1 waited "
              + ", ".join(f"{w:.2f} s" for w in r["waited_s"])
              + f"; rank 0 was told: {r['errors'][0]}")
        assert all(r["timeout_s"] <= w < r["timeout_s"] + 0.5 for w in r["waited_s"])
    assert not any("Rank 2" in r["errors"][0] for r in hung), "a plain timeout names nobody"
    overshoot = max(w - r["timeout_s"] for r in hung for w in r["waited_s"])  # s past the timeout
    waits = sum(len(r["waited_s"]) for r in hung)
    print(f"the longest wait overshot its configured timeout by {overshoot * 1e3:.0f} ms ({waits} "
          f"waits)")
    return overshoot, waits


def plot_stalls(traces: dict, stall: dict) -> None:
    """Draw each rank's step times with synchronous and with asynchronous saves (rank 0 of the
    run without saves in grey, the saves dotted), each panel titled with its loss per save."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    for ax, mode in zip(axes, ("sync", "async")):
        tr = traces[mode]
        for rank, row in enumerate(tr["step_s"]):
            ax.plot(np.array(row) * 1e3, "o-" if rank == 0 else "s--", ms=3, label=f"rank {rank}")
        ax.plot(np.array(traces["none"]["step_s"][0]) * 1e3, ":", color="grey", lw=1,
                label="rank 0, run without saves")
        for k in tr["saved"]:
            ax.axvline(k, color="grey", lw=0.6, ls=":")
        ax.set_title(f"{mode} save: {stall[mode]['lost_per_save_s'] * 1e3:.0f} ms lost per "
                     f"save (median; {min(stall[mode]['lost_s']) * 1e3:.0f} to "
                     f"{max(stall[mode]['lost_s']) * 1e3:.0f}, {stall[mode]['saves']} saves)",
                     fontsize=10)
        ax.set_xlabel("step (dotted: rank 0 saves)")
    axes[0].set_ylabel("step time (ms)")
    axes[0].legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def stall_table_lines(stall: dict) -> list[str]:
    """The two save modes side by side (ms, medians: the saving step's block, the copy (async
    only), the write, the loss per save, saves), every save's loss (and, when a synchronous
    save lost over twice the median, how many times), and the noise floor of the run without
    saves."""
    sy, asy = stall["sync"], stall["async"]
    floor = sy["noise_max_s"]  # the largest window excess of the run without saves
    lines = [f"{'mode':6s}{'saving step blocked':>20s}{'copy':>6s}{'write':>7s}"
             f"{'lost per save':>15s}{'saves':>7s}   (ms, medians)"]
    for name, r in (("sync", sy), ("async", asy)):
        copy = f"{r['copy_s'] * 1e3:6.0f}" if name == "async" else f"{'-':>6s}"
        lines.append(f"{name:6s}{r['blocked_s'] * 1e3:20.0f}{copy}{r['write_s'] * 1e3:7.0f}"
                     f"{r['lost_per_save_s'] * 1e3:15.0f}{r['saves']:7d}")
    lines.append("lost per save, each (ms): " + "; ".join(
        f"{name} " + ", ".join(f"{x * 1e3:.0f}" for x in r["lost_s"])
        for name, r in (("sync", sy), ("async", asy))))
    worst = max(sy["lost_s"])
    if worst > 2 * sy["lost_per_save_s"]:
        lines.append(f"sync: its slowest save lost {worst / sy['lost_per_save_s']:.1f}x the "
                     f"median (not investigated here)")
    lines.append(f"without saves the same windows were off by {round(sy['noise_s'] * 1e3)} ms "
                 f"(median), {floor * 1e3:.0f} ms at most: the noise floor")
    return lines


def async_outlier_line(traces: dict, stall: dict) -> str | None:
    """When the asynchronous save's worst window lost more than half of what a synchronous
    save loses (median) and more than its own median plus the noise floor, where that loss
    sat: the window's steps, its largest step on rank 0 and how many steps after the save,
    rank 1's excess at that step, and that save's write; the run cannot say whether the save
    caused it. None otherwise."""
    import numpy as np

    sy, asy = stall["sync"], stall["async"]
    lost = asy["lost_s"]
    i = int(np.argmax(lost))
    if not (lost[i] > 0.5 * sy["lost_per_save_s"]
            and lost[i] > asy["lost_per_save_s"] + sy["noise_max_s"]):
        return None
    tr = traces["async"]
    steps = np.asarray(tr["step_s"])
    save = tr["saved"][i]
    end = min(save + asy["window_steps"], steps.shape[1])
    k = save + int(np.argmax(steps[0][save:end]))
    write = (f"; that save's write took {tr['write_s'][i] * 1e3:.0f} ms"
             if i < len(tr["write_s"]) else "")
    return (f"async: its worst window (steps {save} to {end - 1}) lost {lost[i] * 1e3:.0f} ms, "
            f"{(steps[0][k] - asy['step_s']) * 1e3:.0f} ms of it in step {k}, {k - save} steps "
            f"after the save (rank 1's step {k}: "
            f"{(steps[1][k] - asy['rank1_step_s']) * 1e3:+.0f} ms){write}; this run does not "
            f"show whether the save caused it")


def print_stall_table(stall: dict, traces: dict | None = None) -> None:
    """Print `stall_table_lines(stall)`, then `async_outlier_line(traces, stall)` if any."""
    for line in stall_table_lines(stall):
        print(line)
    note = async_outlier_line(traces, stall) if traces is not None else None
    if note:
        print(note)


def stall_verdict(stall: dict) -> str:
    """Which save mode cost the job less per save, in words: a difference counts only beyond
    the noise floor (the run without saves' largest window excess); within it, no difference
    is shown."""
    sy, asy = stall["sync"], stall["async"]
    floor = sy["noise_max_s"]
    gap = sy["lost_per_save_s"] - asy["lost_per_save_s"]
    return (f"the asynchronous save cost the job {gap * 1e3:.0f} ms less per save than the "
            f"synchronous one" if gap > floor else
            f"the asynchronous save cost the job {-gap * 1e3:.0f} ms more per save than the "
            f"synchronous one" if gap < -floor else
            f"the two modes' cost per save differed by {abs(gap) * 1e3:.0f} ms, within the "
            f"{floor * 1e3:.0f} ms floor: no difference shown")


def stall_holds(stall: dict) -> bool:
    """The stall claim: the saving step was blocked longer (beyond the noise floor) when
    synchronous than when asynchronous, the asynchronous block was no more than its copy
    (within the noise floor), and rank 1's step right after a synchronous save grew by at
    least half of rank 0's write (rank 1 reaches the next all-reduce on time and waits there
    for the write, whatever this machine's disk speed)."""
    sy, asy = stall["sync"], stall["async"]
    floor = sy["noise_max_s"]
    return (asy["blocked_s"] + floor < sy["blocked_s"]
            and asy["blocked_s"] <= asy["copy_s"] + floor
            and sy["after_s"] - sy["rank1_step_s"] > 0.5 * sy["write_s"])


def explain_stalls(stall: dict, loss_verdict: str) -> None:
    """A headline (each mode's time lost per save); then conclude the stall claim
    (`stall_holds`; not shown when the machine's noise exceeded a
    step); then print each mode's blocked and lost time per save, the verdict on the loss per
    save with rank 1's step after a synchronous save, and a hypothesis when a synchronous save
    cost more than its write beyond the noise floor."""
    sy = stall["sync"]
    floor = sy["noise_max_s"]
    print(f"Lost per save (medians): synchronous {sy['lost_per_save_s'] * 1e3:.0f} ms, "
          f"asynchronous {stall['async']['lost_per_save_s'] * 1e3:.0f} ms ({sy['saves']} saves "
          f"each).")
    _ = conclude(stall_holds(stall),
                 "the saving step waited for the write when the save was synchronous and only "
                 "for the copy when it was asynchronous, and rank 1's step after a synchronous "
                 "save grew by at least half of rank 0's write",
                 busy=f"without saves a window was still off by up to {floor * 1e3:.0f} ms, more "
                 f"than a typical step" if floor > sy["step_s"] else None)
    asy = stall["async"]
    print(f"Per save (medians): synchronous, blocked {sy['blocked_s'] * 1e3:.0f} ms and lost "
          f"{sy['lost_per_save_s'] * 1e3:.0f} ms; asynchronous, blocked "
          f"{asy['blocked_s'] * 1e3:.0f} ms (its copy: {asy['copy_s'] * 1e3:.0f} ms) and lost "
          f"{asy['lost_per_save_s'] * 1e3:.0f} ms.")
    print(f"{loss_verdict} on this run; rank 1's step right after a synchronous save took "
          f"{sy['after_s'] * 1e3:.0f} ms (median of {sy['after_n']}) against "
          f"{sy['rank1_step_s'] * 1e3:.0f} ms typical")
    # Said only when the excess is clear of both the windows' noise and a tenth of the write
    # (a quiet run can report a noise floor of 0 ms: a sub-millisecond excess is no evidence).
    excess = sy["lost_per_save_s"] - sy["write_s"]
    if excess > max(floor, 0.1 * sy["write_s"]):
        print(f"the synchronous save cost the job {excess * 1e3:.0f} ms more "
              f"({sy['lost_per_save_s'] * 1e3:.0f} ms) than its write took "
              f"({sy['write_s'] * 1e3:.0f} ms), beyond the noise floor "
              f"({floor * 1e3:.0f} ms) and a tenth of the write. A "
              f"hypothesis, not measured here: both ranks share this one machine's disk, so the "
              f"write's flush can slow rank 1 too")


def survivor_saw(errors: list[str]) -> str:
    """What the surviving rank was told, quoted for the table's heading: the "Connection ...
    by peer" phrase when the error has one, else the error's first 60 characters, else that
    torchrun stopped the survivor first."""
    said = re.search(r"Connection \w+ by peer", errors[0]) if errors else None
    return (f'"{said.group(0)}"' if said else f'"{errors[0][:60]}"' if errors
            else "torchrun stopped the survivor first")


def real_cluster_text(errors: list[str]) -> str:
    """The `facts.show` template of "On a real GPU cluster": who notices a death and what
    restarts the job in three sentences (with what this run's survivor saw), then timeouts,
    restarts, Young's regime at Llama 3's scale, asynchronous checkpoints and beyond; the
    case-by-case table and the edge cases in a note for experts."""
    from .. import facts

    days = facts.get("meta.llama3_snapshot_days").value
    count = facts.get("meta.llama3_interruptions").value
    adam_b = facts.get("paper.zero_adam_state_bytes").value  # optimizer state per parameter
    seen = survivor_saw(errors)
    return f"""
- **Failures at scale.** Llama 3 405B on [[meta.llama3_gpus]] met
  [[meta.llama3_interruptions]] unexpected interruptions in [[meta.llama3_snapshot_days]], one
  every {days * 24 / count:.1f} hours. Young's regime fits this scale: [[paper.young_1974]]
  assumes C ≪ τ ≪ M.
- **Restarts.** On a cluster add finding a healthy node and reading the checkpoint:
  mixed-precision Adam's state alone (fp32 weights, two moments) is
  [[paper.zero_adam_state_bytes]], about {70e9 * adam_b / 1e12:.1f} TB for a 70B-parameter
  model; with the bf16 weights (2 bytes per parameter) as well, about
  {70e9 * (adam_b + 2) / 1e12:.1f} TB.
- **Who notices a death** (torchrun of torch 2.13; on this run:
{seen}). With restarts left, [[pytorch.torchrun_restarts_all]]; who notices differs: over
  TCP the peers at once, inside an NVLink node (by a 2020 maintainer's answer) only the dead process's own agent, for a dead
  node the senders once the NIC's retries run out and the others at the process group's
  timeout (next fold).

<details><summary>Who notices a death, in three cases</summary>

- *A process dies, its peers talk over TCP* (Gloo; NCCL over sockets:
  "[[nccl.socket_peer_closed]]"): the peers get an error in their current or next collective,
  because the kernel closes the dead process's sockets.
- *A process dies inside an NVLink node* (NCCL): its peers get no error (they exchange data
  through GPU memory, not sockets; NCCL reports a peer's failure only over the network:
  [NVIDIA/nccl#279](https://github.com/NVIDIA/nccl/issues/279), maintainer's answer of 2020,
  not re-checked against 2.30); the
  dead process's own agent notices it at its next poll.
- *A whole node dies*, and its agent with it: the survivors that send to it get an error once
  the NIC's retries run out (on InfiniBand nominally [[nccl.ib_total_wait_default]] at NCCL's
  defaults); the others wait for the process group's timeout
  ([[pytorch.nccl_timeout_default]] for NCCL).

Case by case in the note for experts below.
</details>

<details><summary>More: asynchronous checkpoints, recovery without storage, silent
failures</summary>

- **Asynchronous checkpoints.** `torch.distributed.checkpoint.async_save` makes
  [[pytorch.dcp_async_save_staging]] and writes it from another thread; the training waits for
  that copy unless an `async_stager=DefaultStager(...)` built with
  [[pytorch.dcp_async_staging_option]] (documented as CUDA only) moves it to the background
  too. It needs a CPU backend in the process group (e.g. `"cpu:gloo,cuda:nccl"`; it asserts so).
- **Beyond restarting everything from storage.** With [[paper.gemini_in_memory_2023]]
  (GEMINI) a job recovers from memory instead of remote storage; with [[pytorch.torchft]] only
  the failed replica restarts, fetching the live state from a healthy peer.
- **Not every failure crashes.** Hardware can compute wrong results with no error report:
  [[paper.silent_data_corruption_2021]], found in Meta's CPU fleet. Nodes are screened before
  and between jobs: [[nvidia.dcgm_health]].
</details>

<details><summary>For experts: who notices a death, case by case, and edge cases</summary>

An agent that wants a new group joins the rendezvous' *wait list*; the other agents
then see a node waiting. The watchdog (defined in *A hung peer and timeouts*) ends the process
when a collective is still running after the process group's timeout; under ProcessGroupNCCL's
default TORCH_NCCL_ASYNC_ERROR_HANDLING = [[pytorch.nccl_async_error_handling|value]] it does so
without aborting the NCCL communicator, but torchrun starts its workers with
[[pytorch.torchrun_async_error_handling|value]] when the variable is unset
([[pytorch.torchrun_async_error_handling]]), which aborts it first. Terms: SHM, shared memory; ncclRemoteError, NCCL's error code
for a failed peer.

| case | who notices | what torchrun does |
|---|---|---|
| 1. a killed process, peers on TCP (Gloo; NCCL over sockets) | its peers in their current or next collective (the kernel closes its sockets); its own agent at its next poll (every [[pytorch.torchrun_monitor_interval]]; [[pytorch.torchrun_monitor_interval_before_124692]] in releases before pytorch#124692, April 2024) | starts a new group; the job resumes after the restart |
| 2. a crashed process (OOM kill, segfault) under NCCL inside a node ([[nccl.intranode_transports]]), restarts left | its own agent at its next poll; its peers get no error | [[pytorch.torchrun_crash_path]]; the job resumes after the restart |
| 3. a dead node (its agent dies with it) | over InfiniBand or RoCE, the peers that send to it, once the NIC's retries run out (*a crashed process whose peers are on other nodes*, below), the others alone at the watchdog's timeout; over TCP (Gloo, NCCL sockets), every peer at the process group's timeout (a dead node closes no sockets; a sender that is still retransmitting gets an error when Linux's retry limit, [`tcp_retries2`](https://docs.kernel.org/networking/ip-sysctl.html), runs out, before or after that timeout depending on the backend's) | the first failing survivor's agent re-enters the rendezvous; the others restart their workers at their next poll. The new round starts once the dead node's *keep-alive* (the heartbeat each agent writes to the rendezvous store) has lapsed, [[pytorch.rdzv_dead_node_after]], and with `--nnodes MIN:MAX` short of MAX after a *last call* for late joiners, [[pytorch.rdzv_last_call_timeout]] ([12b](12b_elastic_resharding.ipynb)); with a fixed `--nnodes`, only once a replacement joins |

- **No restarts left.** With torchrun's default --max-restarts of
  [[pytorch.torchrun_max_restarts_default|value]], in case 2 the agent stops its node's workers
  and exits, and the job fails. Every other agent stops too once its workers fail: at once
  over sockets; over InfiniBand or RoCE, a sender after the NIC's retries, a worker that only
  receives at the watchdog's timeout; or, if the exited agent hosted the rendezvous store, at
  its next poll of the store.
- **A crashed process whose peers are on other nodes (IB/RoCE).** A peer that sends to the dead process also gets
  [[nccl.remote_error]] after the NIC's retries (nominally [[nccl.ib_total_wait_default]] at
  NCCL's default NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT; sooner on some RoCE NICs, below); a
  peer that only receives may get none. torchrun does as in case 2.
- **A rank stuck in I/O.** By default no agent sees a hung worker; with the opt-in
  [[pytorch.torchelastic_uninterruptible_timeout]] set, an agent whose worker sleeps that many
  seconds in the kernel's uninterruptible state (D-state) stops its workers and exits, without
  a restart.
- **RoCE.** ConnectX NICs with adaptive retransmission may give up sooner, as each retry's
  wait adapts, [[nvidia.roce_adp_timeout_cap]] (a QP, queue pair, is one RDMA connection;
  its ACK timeout is how long the NIC waits for an acknowledgement before it resends).
- **The dead node hosted the c10d rendezvous store** (`--rdzv-endpoint`). The job never
  resumes; the other agents fail when they cannot reach it
  ([pytorch#67742](https://github.com/pytorch/pytorch/issues/67742)), which a store outside
  the job (etcd) avoids.
</details>
"""  # noqa: E501 (Markdown table rows and prose shown verbatim)


def measured_here(*, failure: dict, job2, traces: dict, stall: dict, hung: list[dict],
                  overshoot: float, waits: int, loss_verdict: str, ideal: float,
                  predicted: float) -> str:
    """The notebook's measurements as four bullets: the restarts' range, a hung peer's
    overshoot, the synchronous saves' block against the asynchronous one and the verdict on
    their loss, and the second job's useful share of its training time (and of torchrun's
    whole run) against the estimate."""
    sy, asy = stall["sync"], stall["async"]
    s2 = job2.summary()
    restarts_s = [x["restart_s"] for x in [failure] + job2.failures()]
    blocked = [traces["sync"]["step_s"][0][k] - sy["step_s"] for k in traces["sync"]["saved"]]
    return (f"Measured here:\n"
            f"- restart: a restart under torchrun took {min(restarts_s):.2f} to "
            f"{max(restarts_s):.2f} s ({len(restarts_s)} restarts), plus the redone work "
            f"({failure['redo_s']:.2f} s in the first job)\n"
            f"- hang: a hung peer cost the configured timeout plus at most "
            f"{overshoot * 1e3:.0f} ms ({waits} waits, timeouts of "
            + " and ".join(f"{r['timeout_s']:.1f}" for r in hung) + " s)\n"
            f"- checkpoint stall: a synchronous save of 32 MB blocked its step "
            f"{sy['blocked_s'] * 1e3:.0f} ms (median; each save {min(blocked) * 1e3:.0f} to "
            f"{max(blocked) * 1e3:.0f} ms, {sy['saves']} saves), an asynchronous one "
            f"{asy['blocked_s'] * 1e3:.0f} ms (median); counting the time the whole job "
            f"lost, not the saving step's block, {loss_verdict} (medians)\n"
            f"- goodput: with {s2['failures']} injected failures "
            f"the job did useful work {ideal / s2['train_s']:.0%} of its training time "
            f"({ideal / s2['wall_s']:.0%} of torchrun's whole run), "
            f"{s2['train_s'] / predicted - 1:+.0%} off the estimate built from the first "
            f"job's medians and its one start-up and one restart (one run, not a "
            f"validation)")
