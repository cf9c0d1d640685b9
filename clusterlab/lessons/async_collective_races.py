"""What `notebooks/06_async_collective_races.ipynb` reads from its runs.

The experiments are `clusterlab.experiments.async_races`; each function here turns one
cell's runs into the figure and the sentences the learner reads, and checks what the text
claims.
"""

from __future__ import annotations

from .show import details, say

ASYNC_FIXES = ("wait_then_read", "wait_then_edit")


# --- Async collectives: touching a buffer before wait() ---------------------------------------

def plot_async_races(ar: dict) -> None:
    """Bar chart of `races.async_collective_races`: the share of reads with a wrong value for
    each variant, red for touching the buffer before wait(), green for the fixes."""
    import matplotlib.pyplot as plt

    from ..experiments import async_races as races

    v, variants = ar["variants"], races.ASYNC_VARIANTS
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar(range(len(variants)), [100 * v[n]["wrong_trials"] / v[n]["reads"] for n in variants],
           color=["C3" if n.endswith("before_wait") else "C2" for n in variants])
    ax.set_xticks(range(len(variants)), [n.replace("_", " ") for n in variants], fontsize=8)
    ax.set_ylabel(f"rank-trials with a wrong value\n(% of {v[variants[0]]['reads']})")
    ax.set_ylim(0, 110)
    for k, n in enumerate(variants):
        ax.text(k, 100 * v[n]["wrong_trials"] / v[n]["reads"] + 2,
                f"{v[n]['wrong_trials']}/{v[n]['reads']}", ha="center", fontsize=8)
    ax.set_xlabel(f"variant ({ar['trials']} trials on each of {ar['workers']} ranks)")
    ax.set_title("Touching the buffer before wait() gives wrong values")
    plt.show()


def agreeing_wrong_trials(ar: dict) -> int:
    """Trials whose ranks agreed on wrong values after an edit before wait(), at least: all
    trials, minus those whose ranks disagreed, minus the most that can have been all right
    (one per `workers` right reads). A replica checksum cannot catch these."""
    d = ar["variants"]["edit_before_wait"]
    return ar["trials"] - d["disagree_trials"] - (d["reads"] - d["wrong_trials"]) // ar["workers"]


def explain_async_races(ar: dict, ar1: dict) -> None:
    """What the early reads saw and what became of the early edits (1 MiB bucket, `ar`), the
    trials a replica checksum would miss, the fixes' counts, and how many early reads happened
    to be right (also for a one-element tensor, `ar1`); asserts that touching before wait()
    went wrong and that the fixes never did."""
    v = ar["variants"]
    d = v["read_before_wait"]  # what a wrong read saw: this rank's own value, or a partial sum
    print(f"read before wait(): wrong in {d['wrong_trials']} of {d['reads']} rank-trials "
          f"({d['wrong_elements']:.1%} of the elements): own value {d['local']:.1%}, "
          f"partly reduced {d['wrong_elements'] - d['local']:.1%}")
    d = v["edit_before_wait"]  # what became of the edit, and whether the replicas still agree
    print(f"edit before wait(): wrong in {d['wrong_trials']} of {d['reads']} rank-trials: edit "
          f"sent by every rank (410) {d['edit_sent']:.1%} of the elements, overwritten by Gloo "
          f"(10) {d['edit_lost']:.1%}, other wrong values (some ranks' edits sent, or a mix) "
          f"{d['wrong_elements'] - d['edit_sent'] - d['edit_lost']:.1%}, right by chance (110) "
          f"{1 - d['wrong_elements']:.1%}; "
          f"ranks disagree in {d['disagree_trials']} of "
          f"{ar['trials']} trials")
    agree_wrong = agreeing_wrong_trials(ar)
    if agree_wrong > 0:
        print(f"  in {'' if d['wrong_trials'] == d['reads'] else 'at least '}{agree_wrong} of "
              f"{ar['trials']} trials every rank held the same wrong values: a replica checksum "
              "cannot catch those")
    fixes = ASYNC_FIXES
    print(f"the fixes ({', '.join(fixes)}): wrong in "
          f"{', '.join(str(v[n]['wrong_trials']) for n in fixes)} of {v[fixes[0]]['reads']} "
          "rank-trials; ranks disagree in "
          f"{', '.join(str(v[n]['disagree_trials']) for n in fixes)} of {ar['trials']} trials")
    rb, rb1 = v["read_before_wait"], ar1["variants"]["read_before_wait"]
    ok, ok1 = rb["reads"] - rb["wrong_trials"], rb1["reads"] - rb1["wrong_trials"]
    print(f"reads before wait() that happened to be right: {ok} of {rb['reads']} (1 MiB bucket), "
          f"{ok1} of {rb1['reads']} (one element)"
          + (": such a read passes a test and fails on another run" if ok + ok1 else
             ": none on this run, but nothing orders the read after Gloo's write"))
    assert v["read_before_wait"]["wrong_trials"] > 0 and v["edit_before_wait"]["wrong_trials"] > 0
    for n in ASYNC_FIXES:
        assert v[n]["wrong_trials"] == 0 and v[n]["disagree_trials"] == 0, n


# --- A communication hook that does not wait ----------------------------------------------------

def explain_hook_race(runs: dict) -> None:
    """What DDP did with each hook (`async_races.ddp_hook_race` results by hook name): wrong
    gradients, how many were this rank's own gradient unreduced, replicas that differ, and
    the loss that fell either way; asserts that the chained hook was right at every step."""
    ok, bad = runs["chained"], runs["unchained"]
    for r in (ok, bad):
        what = (f"; in them, {r['unreduced']:.0%} of the elements held the rank's own gradient / "
                f"{r['workers']}, unreduced (elements where that equals the true average left "
                "out)" if r["wrong_steps"] else "")
        print(f"{r['hook']} hook: gradient wrong in {r['wrong_steps']} of {r['rank_steps']} "
              f"rank-steps ({r['workers']} ranks x {r['steps']} steps{what}); replicas "
              f"differed after {r['differ_steps']} of {r['steps']} steps; rank 0's held-out "
              f"loss {r['loss_first']:.3g} -> {r['loss_last']:.3g}")
    both_fell = bad["loss_last"] < bad["loss_first"] and ok["loss_last"] < ok["loss_first"]
    if bad["wrong_steps"]:
        print("The loss fell under both hooks" if both_fell else "The loss did not fall under "
              "both hooks", end="")
        print(f" ({bad['loss_last'] / ok['loss_last']:.1f}x higher at the end without the "
              "chain): without a baseline run to compare with, a falling loss does not show the "
              "bug; the replica checksum did"
              if both_fell and bad["differ_steps"] else ".")
    else:
        print("The unchained hook happened to be right on every step of this run: such a bug "
              "passes a test and fails on another machine.")
    assert ok["wrong_steps"] == 0 and ok["differ_steps"] == 0


# --- On a real GPU cluster ----------------------------------------------------------------------

# Where the races are on GPU ranks (from the sources, not run here), rendered by `facts.show`.
GPU_RACES = """
- **wait() is a stream wait.** For NCCL, by default, [[pytorch.async_op_cuda_semantics]]
  ([[pytorch.nccl_blocking_wait]] makes it block the host): ops then issued on the current
  stream are ordered; work on another stream races with the collective, as measured above
  on Gloo (a host read of a `non_blocking` copy races with the copy: next point).
- **A copy to the host.** `x = t.to("cpu", non_blocking=True)` gives
  [[pytorch.non_blocking_d2h]]: a loss or metric logged from `x` can be incomplete or garbage.
  Synchronise first (`torch.cuda.synchronize()`, or `synchronize()` on an event recorded
  after the copy).
"""

# The rest, for the expert reader: shown folded by `show_more_gpu_races`.
GPU_RACES_MORE = """
- **Side streams.** The caching allocator (PyTorch's reuse of freed GPU memory) tracks
  only the stream a tensor was allocated on.
  A copy or overlap you run on a side stream must [[pytorch.record_stream]] or sync with an
  event before the tensor is freed, or its memory goes to the next allocation while that
  work still reads it.
- **Finding stream races.** Kernels on two streams that touch one tensor with no
  synchronisation between them race; the CUDA Stream Sanitizer
  ([[pytorch.cuda_stream_sanitizer]]) records each PyTorch operator's reads and writes on
  the stream current at the call and stops at the first operator that races, listing its
  conflicts. So (our inference from how it records) it does not see kernels launched outside
  PyTorch's operators, nor the stream NCCL really runs a collective on.
- **Asynchronous checkpoints.** Distributed Checkpoint's (DCP) `async_save` writes
  [[pytorch.dcp_async_save_staging]] from another thread (by default; it can also use a
  separate process). By default it returns only after
  that copy is made (the copy stalls the training loop) and only the write runs in the
  background. With async staging (pass `async_stager=DefaultStager(...)` built with
  [[pytorch.dcp_async_staging_option]]; documented as requiring CUDA) the copy runs in the
  background too: wait on its `staging_completion` before the next optimizer step (notebook 12),
  or the checkpoint mixes two steps.
"""


def show_more_gpu_races() -> None:
    """Shows `GPU_RACES_MORE`, cited from the ledger with its own sources, behind one fold."""
    from .. import facts

    say(details("More: side streams, the CUDA Stream Sanitizer, asynchronous checkpoints",
                facts.render(GPU_RACES_MORE)))
