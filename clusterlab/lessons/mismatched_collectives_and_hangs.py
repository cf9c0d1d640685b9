"""What notebook 08b reads from its runs: mismatched collectives, swapped order, hangs.

The runs are `clusterlab.experiments.divergence`'s (plain dicts); here they become the tables
and sentences the learner reads, and the checks that the run showed what the text says. The
ledger-cited texts of "On a real GPU cluster" are templates for `facts.show`.
"""

from __future__ import annotations

import textwrap

HEADER = f"{'case':8s}{'debug':8s}{'outcome':16s}{'ranks':8s}{'after':>6s}  what it says"


def outcome_row(m: dict) -> str:
    """One run of `divergence.mismatched_collective` as a row of the outcomes table: case,
    debug mode, outcome, the ranks it names, seconds until it ended, and what it said (wrapped
    at 100 characters under its column). The ranks are those still inside the call
    (ClusterTimeout) or the one that died (RankDied); '-' for a RankError, where the launcher
    names only the first rank to report an error that, under DETAIL, every rank raises."""
    ranks = "-" if m["error"] == "RankError" else str(m["ranks"])
    row = (f"{m['case']:8s}{str(m['debug']):8s}{m['error']:16s}{ranks:8s}"
           f"{m['wall_s']:5.2f}s  ")
    return textwrap.fill(row + m["said"], 100, subsequent_indent=" " * len(row))


def legend_lines(mism: dict, *, plain_timeout_s: float) -> list[str]:
    """What the outcomes table's words mean, one entry per column (wrapped at 96 characters,
    indented): the three outcomes, the ranks column, and `after`, with the seconds a
    `ClusterTimeout` run on plain Gloo took beyond its bound `plain_timeout_s` (clusterlab's
    pause to collect the stuck ranks' stacks, `Cluster._timeout_error`, then its start-up and
    teardown; the mean over those rows, left out when there is none)."""
    over = [m["wall_s"] - plain_timeout_s for m in mism.values()
            if m["error"] == "ClusterTimeout" and m["debug"] is None]
    after = "seconds from starting the processes until the run ended (one run per case)"
    if over:  # a no-break space keeps a number with its unit when wrapped
        after += (f": a ClusterTimeout's bound plus about {sum(over) / len(over):.1f}\u00a0s: "
                  "clusterlab collecting the stuck ranks' stacks, and its start-up and teardown")
    entries = [
        ("outcome", f"ClusterTimeout, clusterlab stopped a run still busy at its bound "
                    f"({plain_timeout_s:g}\u00a0s; the process group's own, longer timeout never "
                    "fired); RankDied, a rank process died; RankError, a rank raised"),
        ("ranks", "those still inside the call, or the one that died; '-' for RankError "
                  "(under DETAIL every rank raises)"),
        ("after", after),
        ("what it says", "DETAIL's error, from the first rank to report it; else Gloo's own "
                         "diagnostic, from the rank's stderr; else nothing"),
    ]
    return [textwrap.fill(f"{name}: {text}", 96, initial_indent="    ",
                          subsequent_indent="        ").replace("\u00a0", " ")
            for name, text in entries]


def outcome_words(m: dict) -> str:
    """One plain-Gloo mismatch run in a few words, from its outcome: a hang (of the ranks still
    waiting, and what a rank that returned holds), a rank that died, or an error."""
    if m["error"] == "RankDied":
        return f"rank {m['ranks'][0]} crashed"
    if m["error"] == "RankError":
        return "an error"
    if m["error"] != "ClusterTimeout":
        return str(m["error"])
    wrong = [r for r, held in m.get("returned", {}).items()
             if "sum" in m and held != [m["sum"]] * len(held)]
    if wrong:
        return (f"rank {m['ranks'][0]} hung while rank {wrong[0]} returned a wrong result "
                "without an error")
    return "a hang" + (" of both ranks" if len(m["ranks"]) == 2 else "")


def lead_outcomes(mism: dict) -> str:
    """The one-line message of the six runs: what each mismatch did on plain Gloo, and whether
    `DETAIL` turned every one into a named error."""
    plain = "; ".join(f"{case}: {outcome_words(m)}" for (case, debug), m in mism.items()
                      if debug is None)
    named = all(m["error"] == "RankError" and "Detected mismatch between collectives"
                in m.get("message", "") for (_, debug), m in mism.items() if debug)
    return (f"In short: on plain Gloo, {plain}. With DETAIL, "
            + ("every case became an error that names each rank's collective."
               if named else "not every case became a named error."))


def print_outcomes(mism: dict, *, plain_timeout_s: float | None = None) -> None:
    """Print the table of the six mismatch runs, `mism[case, debug]`, one row per run; with
    `plain_timeout_s` (the bound of the plain-Gloo runs), a one-line summary first
    (`lead_outcomes`) and the table's key below it."""
    if plain_timeout_s is not None:
        print(lead_outcomes(mism))
    print(HEADER)
    for m in mism.values():
        print(outcome_row(m))
    if plain_timeout_s is not None:
        # The key is reference: folded, so the summary line and the table read straight on.
        from . import show

        show.fold("Key to the columns: outcome, ranks, after, what it says",
                  "\n".join(["key:", *legend_lines(mism, plain_timeout_s=plain_timeout_s)]),
                  pre=True)


def smaller_lines(small: dict) -> list[str]:
    """The `smaller` case on plain Gloo in words: the ranks' inputs and the right sum, then
    each rank that returned without an error with what it holds, marked as a silently wrong
    result when it is not the right sum in every element."""
    lines = [f"smaller, plain Gloo: inputs {small['inputs'][0]} on rank 0, {small['inputs'][1]} "
             f"on rank 1 (the right sum: {small['sum']:g} in each element)"]
    for rank, held in small["returned"].items():
        wrong = held != [small["sum"]] * len(held)
        lines.append(f"    rank {rank} returned without an error, holding {held}: "
                     f"{small['held'][rank]}" + (", a wrong result, silently" if wrong else ""))
    return lines


def explain_smaller(small: dict) -> None:
    """Show `smaller_lines(small)` behind a fold: whose data each returning rank holds (the
    summary line above the table already says it in words)."""
    from . import show

    show.fold("The smaller case: whose data rank 1 returned", "\n".join(smaller_lines(small)),
              pre=True)


def print_detail_error(m: dict) -> None:
    """Show one `DETAIL` error message in full behind a fold (printed as it is outside a
    notebook)."""
    from . import show

    show.fold("One DETAIL error in full", m["message"])


def check_mismatches(mism: dict, *, detail_timeout_s: float) -> None:
    """Assert what the text says of the six runs: on plain Gloo the op mismatch hangs both
    ranks, the larger size kills rank 0, the smaller size leaves rank 0 waiting while rank 1
    returns holding wrong values; with `DETAIL` every case is a named `RankError` raised before
    `detail_timeout_s`."""
    small = mism["smaller", None]
    assert mism["op", None]["error"] == "ClusterTimeout" and mism["op", None]["ranks"] == [0, 1]
    assert mism["size", None]["error"] == "RankDied" and mism["size", None]["ranks"] == [0]
    assert small["error"] == "ClusterTimeout" and small["ranks"] == [0], "rank 0 waits"
    assert "returned already: rank 1" in small["message"] and 1 in small["returned"], (
        "rank 1 returned")
    assert small["returned"][1] != [small["sum"]] * 2, "rank 1 holds wrong values"
    for m in mism.values():
        if m["debug"] == "DETAIL":
            assert (m["error"] == "RankError"
                    and "Detected mismatch between collectives" in m["message"])
            assert m["wall_s"] < detail_timeout_s, "an error, before the timeout"


def swap_lines(swap: dict) -> list[str]:
    """The swapped-order runs, `swap[debug]`, in words: per debug mode the error and time,
    then what each rank holds for `layer_a` and `layer_b`; last the correct sums and whether
    the ranks agree (with `DETAIL`)."""
    lines = []
    for debug, r in swap.items():
        lines.append(f"TORCH_DISTRIBUTED_DEBUG={debug or 'OFF'}: error {r['error']}; after "
                     f"{r['wall_s']:.1f} s")
        for rank, held in enumerate(r["result"]):
            lines.append(f"    rank {rank}: layer_a = {held['layer_a'][0]:g}, "
                         f"layer_b = {held['layer_b'][0]:g}")
    expected = swap[None]["expected"]
    lines.append(f"correct: layer_a = {expected['layer_a'][0]:g}, "
                 f"layer_b = {expected['layer_b'][0]:g}; "
                 f"ranks agree: {swap['DETAIL']['ranks_agree']}")
    return lines


def lead_swap(swap: dict) -> str:
    """The one-line message of the swapped-order runs: whether any run hung or raised, and
    whether every sum was wrong and the ranks disagreed."""
    raised = [debug or "OFF" for debug, r in swap.items() if r["error"] is not None]
    all_wrong = all(r["wrong"] == [["layer_a", "layer_b"]] * len(r["wrong"])
                    for r in swap.values())
    agree = any(r["ranks_agree"] for r in swap.values())
    return ("In short: "
            + ("no hang and no error, with or without DETAIL" if not raised
               else f"an error with TORCH_DISTRIBUTED_DEBUG={', '.join(raised)}")
            + ("; yet every sum is wrong" if all_wrong else "")
            + ("; the ranks disagree." if not agree else "."))


def explain_swap(swap: dict) -> None:
    """Print a one-line summary (`lead_swap`), then `swap_lines(swap)`: what every rank holds
    after the swapped all-reduces."""
    print(lead_swap(swap))
    for line in swap_lines(swap):
        print(line)


def check_swap(swap: dict) -> None:
    """Assert the silent case: no hang and no error, not even with `DETAIL`; both tensors
    wrong on both ranks, and the ranks disagree."""
    for r in swap.values():
        assert r["error"] is None, r["message"]  # no hang, no error, not even with DETAIL
        assert r["wrong"] == [["layer_a", "layer_b"], ["layer_a", "layer_b"]]
        assert not r["ranks_agree"]


def skip_lines(skip: dict) -> list[str]:
    """The skipped-collective runs, `skip[debug]`, in words: for every rank that raised, when
    and its error (up to any 'Original exception' it wraps, wrapped at 96 characters); then the
    ranks rank 0's error names as missing ('none' when it names nobody)."""
    lines = []
    for debug, r in skip.items():
        lines.append(f"TORCH_DISTRIBUTED_DEBUG={debug or 'OFF'}:")
        for rank, message in enumerate(r["messages"]):
            if message:
                first = message.split(" Original exception")[0]
                lines.append(textwrap.fill(f"rank {rank} raised after {r['waits_s'][rank]:.1f} s: "
                                           f"{first}", 96, initial_indent="    ",
                                           subsequent_indent="        "))
        lines.append(f"    ranks named as missing by rank 0: {r['named_ranks'] or 'none'}")
    return lines


def explain_skip(skip: dict, *, wait_s: float) -> None:
    """Print `skip_lines(skip)` and assert what the text says: on plain Gloo ranks 0 and 1
    each raise a timeout of their own that names nobody, `DETAIL` names rank 2, and rank 0
    waited about the group's timeout `wait_s` either way. A one-line summary comes first."""
    plain, detail = skip[None]["named_ranks"], skip["DETAIL"]["named_ranks"]
    print("In short: on plain Gloo the timeouts name "
          + (f"rank(s) {plain}" if plain else "nobody")
          + "; with DETAIL rank 0's error names "
          + (f"the missing rank {', '.join(map(str, detail))}." if detail else "nobody."))
    for line in skip_lines(skip):
        print(line)
    assert all("Timed out" in m for m in skip[None]["messages"][:2]), "ranks 0, 1 time out"
    assert skip[None]["named_ranks"] == [] and skip["DETAIL"]["named_ranks"] == [2]
    assert all(r["waits_s"][0] >= 0.9 * wait_s for r in skip.values()), "bounded by the timeout"


def explain_shifted(run: dict) -> None:
    """The DETAIL run where rank 2 skipped the first of two same-shape all_reduces and called
    the second (`divergence.skipped_collective(..., then=1)`): print what ranks 0 and 1 saw at
    their first call (it met rank 2's second) and at their second (no partner), and assert it:
    the shifted call passed DETAIL's checks and only the call with no partner was named."""
    first_ok = all(r == 1 for r in run["returned"][:2])
    print(f"DETAIL, rank 2 skipped the first of two same-shape all-reduces: ranks 0 and 1 "
          f"returned from {min(run['returned'][:2])} of 2 calls; their first met rank 2's "
          + ("second and passed DETAIL's checks (the sequence number cannot catch the shift: "
             "each rank numbers its own calls); " if first_ok else "second and raised; ")
          + f"their second, with no partner, raised after {run['waits_s'][0]:.1f} s naming rank "
          f"{', '.join(map(str, run['named_ranks'])) or 'nobody'}.")
    assert run["then"] == 1 and first_ok, run["messages"]
    assert run["named_ranks"] == [2], run["messages"][0]


def barrier_line(mb: dict, *, late_s: float) -> str:
    """The monitored-barrier run in words: when rank 0 raised (seconds in the barrier), how
    long the late rank was stuck, and rank 0's error."""
    return (f"rank 0 raised after {mb['waits_s'][0]:.1f} s (the late rank was stuck for "
            f"{late_s:g} s): {mb['message']}")


def explain_barrier(mb: dict, *, barrier_timeout_s: float, late_s: float) -> None:
    """Print `barrier_line(mb)` and assert what the text says: rank 0's error names rank 2, and
    rank 0 waited at least about the barrier's timeout (it is never early)."""
    print(barrier_line(mb, late_s=late_s))
    assert mb["named_ranks"] == [2], mb["message"]
    assert mb["waits_s"][0] >= 0.9 * barrier_timeout_s, "raised at the barrier's timeout"


def detail_coverage() -> str:
    """The `facts.show` template of what `TORCH_DISTRIBUTED_DEBUG=DETAIL` compares before each
    collective and what it does not (torch 2.13's ProcessGroupWrapper.cpp), folded: the
    backends it wraps, then a two-column table."""
    return (
        "<details><summary>For reference: what `DETAIL` checks, and what it does not"
        "</summary>\n\n"
        "`DETAIL` wraps the process groups of [[pytorch.distributed_debug_detail_backends]] "
        "alike: it [[pytorch.distributed_debug_detail]] "
        "([ProcessGroupWrapper.cpp](https://github.com/pytorch/pytorch/blob/v2.13.0/torch/csrc/"
        "distributed/c10d/ProcessGroupWrapper.cpp)).\n\n"
        "| compared across ranks | not compared |\n|---|---|\n"
        "| the op | the reduction op (`SUM` against `MAX`) |\n"
        "| shapes, dtypes, device types | a broadcast's root (`src`) |\n"
        "| a sequence number (each rank counts its own calls, so a skipped call leaves them "
        "equal: *Hangs*) "
        "| an all-to-all's split sizes (only its op) |\n"
        "| | the shapes of `*_coalesced` ops "
        "and of uneven all-gathers and reduce-scatters (only their op) |\n"
        "| | `send` and `recv` |\n\n"
        "Not a compared field: a rank that never arrives is named by the monitored barrier "
        "`DETAIL` runs first.\n\n</details>")

def hang_checklist() -> str:
    """The `facts.show` template of "When a job hangs": first, visible, where a waiting rank's
    stack sits; then, folded for reference, two more places it can sit (communicator creation,
    `dist.breakpoint`), what to set before a run (or the rerun) and what to do while it hangs
    and after its timeout (flight-recorder dumps, py-spy)."""
    return (
        "- **Where a waiting rank's stack sits.** A collective with `async_op=False` "
        "[[pytorch.collective_returns_before_cuda_completes]] (the current stream then waits "
        "on it), so the others wait at the next "
        "host sync (`.item()`, `.cpu()`). To see which collective they wait in, set "
        "[[pytorch.nccl_blocking_wait]]: the stack then sits in the collective itself.\n\n"
        "<details><summary>For reference: when a job hangs, step by step</summary>\n\n"
        "**Two more places a waiting rank can sit.** A group's first collective creates its "
        "communicator ([[pytorch.nccl_lazy_comm_init]]; [[nccl.comm_init_rank_sync]]), so a "
        "hang can sit there; with `device_id` in `init_process_group` it moves to the init and "
        "`new_group`. `torch.distributed.breakpoint(rank=k)`, called on every rank, opens pdb "
        "on rank k while the others wait: it ends in a barrier, so called from a rank-dependent "
        "branch it is itself a mismatch (it also sets every group's timeout to an hour).\n\n"
        "**When a job hangs.** Before a run, or the rerun:\n\n"
        "1. **Bound it**: an explicit `timeout` (settings table below). On NCCL, when a collective "
        "exceeds it, the watchdog tears down its own process (the launcher then ends the job), "
        "and each rank first tries to write its flight-recorder dump (best effort: PyTorch "
        "waits for it only a bounded time). Ranks whose own collective timed out dump at once; "
        "the others dump when [[pytorch.fr_dump_store_signal]].\n"
        "2. **Keep the dumps.** They are written on each rank's own host, by default to "
        "[[pytorch.fr_dump_location]] (`$XDG_CACHE_HOME` replaces `~/.cache` when set): a "
        "container whose home is discarded loses them. Set "
        "TORCH_FR_DUMP_TEMP_FILE to a file-name prefix on persistent shared storage, e.g. "
        "`/shared/fr/trace_rank_` (the rank is appended; the directory must exist).\n"
        "3. **Name a missing rank**: `monitored_barrier` on a Gloo side group at a few chosen "
        "points (above).\n"
        "4. **A suspected mismatched op or shape**: rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL: it "
        "[[pytorch.distributed_debug_detail]] (debugging only). Stuck at start-up: "
        "`NCCL_DEBUG=INFO` logs the communicator set-up; `TORCH_SHOW_CPP_STACKTRACES=1` adds C++ "
        "frames to errors.\n\n"
        "While it hangs, and after its timeout:\n\n"
        "5. **See where every rank is**: [[pyspy.dump_native]] on every rank (it needs the "
        "`SYS_PTRACE` capability, not among Docker's or Kubernetes' default capabilities: add it, "
        "per the same README): the odd rank out is not waiting where the others are.\n"
        "6. **Read the dumps** with [[pytorch.flight_recorder_analyzer]]: it merges them and "
        "reports the first mismatch (op, size, dtype) or the ranks that never joined. For a "
        "job stuck short of its timeout, set TORCH_NCCL_DEBUG_INFO_PIPE_FILE to a file-name "
        "prefix before the run: then [[pytorch.nccl_debug_info_pipe]]. A same-shape swap "
        "issued from one loop leaves no trace there: an entry holds op, sizes, dtypes, timing "
        "and the Python stack, nothing that names the tensor (`struct Entry` in torch 2.13's "
        "[FlightRecorder.hpp](https://github.com/pytorch/pytorch/blob/v2.13.0/torch/csrc/"
        "distributed/c10d/FlightRecorder.hpp))."
        "\n\n</details>")


def hang_settings() -> str:
    """The `facts.show` template of the table "Settings that decide how a hang ends" (torch
    2.13 defaults from the ledger)."""
    return (
        "<details><summary>For reference: settings that decide how a hang ends</summary>\n\n"
        "| Setting (torch 2.13) | Default | What it does |\n"
        "|---|---|---|\n"
        "| `timeout` of `init_process_group` | NCCL: [[pytorch.nccl_timeout_default]]; Gloo: "
        "[[pytorch.gloo_timeout_default]] | set it above the longest time one rank can "
        "wait in a collective while another is busy alone (rank 0 writing a checkpoint or "
        "running evaluation), not to the step time |\n"
        "| TORCH_NCCL_ASYNC_ERROR_HANDLING | [[pytorch.nccl_async_error_handling]] | on a "
        "timeout the watchdog tears the process down |\n"
        "| [[pytorch.fr_buffer_size|value]] | [[pytorch.fr_buffer_default]] | the flight "
        "recorder's ring buffer, in collectives per rank |\n"
        "| TORCH_NCCL_DUMP_ON_TIMEOUT | [[pytorch.nccl_dump_on_timeout]] | the dump on a "
        "timeout |\n"
        "| TORCH_NCCL_DESYNC_DEBUG=1 | off (on under `DETAIL`) | it "
        "[[pytorch.nccl_desync_debug]] |\n\n</details>")


def _skip_label(message: str, named: list) -> str:
    """A rank's error from the skipped-collective run in a few words, for the figure."""
    if named:
        return f"raises: names rank {', '.join(map(str, named))}"
    if "check rank 0" in message:  # DETAIL's other ranks point to rank 0 (a timeout inside)
        return "raises: 'check rank 0 logs'"
    if "Timed out" in message:
        return "raises: a timeout that names nobody"
    return "raises"


def plot_skip(skip: dict, *, wait_s: float, odd_rank: int = 2) -> None:
    """One lane per rank for each run of `divergence.skipped_collective` (plain Gloo, then
    DETAIL): how long each rank waited in the call (measured) and what it raised; rank
    `odd_rank` skipped the collective and returned at once. The dashed line is the group's
    timeout `wait_s`."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(skip), figsize=(12, 2.6), sharex=True)
    for ax, (debug, r) in zip(axes, skip.items()):
        where = "DETAIL's monitored barrier" if debug else "the all_reduce"
        for rank, (wait, message) in enumerate(zip(r["waits_s"], r["messages"])):
            if rank == odd_rank:
                ax.plot(0, rank, "o", color="C2")
                ax.text(0.05 * wait_s, rank, "skipped the all_reduce: returned", va="center",
                        fontsize=8)
                continue
            ax.barh(rank, wait, height=0.4, color="C0", alpha=0.6,
                    label=f"waiting in {where}" if rank == 0 else None)
            ax.plot(wait, rank, "x", color="C3", ms=9, mew=2)
            named = r["named_ranks"] if rank == 0 else []
            ax.text(wait + 0.06 * wait_s, rank, _skip_label(message, named), va="center",
                    fontsize=8)
        ax.axvline(wait_s, color="k", ls="--", lw=0.8)
        ax.set_yticks(range(len(r["waits_s"])), [f"rank {k}" for k in range(len(r["waits_s"]))])
        ax.invert_yaxis()
        ax.set_xlim(-0.05 * wait_s, 2.2 * wait_s)
        ax.set_xlabel(f"seconds after the call (dashed: the group's timeout, {wait_s:g} s)")
        ax.set_title(f"TORCH_DISTRIBUTED_DEBUG={debug or 'OFF'}", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    plt.tight_layout()
    plt.show()
