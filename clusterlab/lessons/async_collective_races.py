"""What `notebooks/06_async_collective_races.ipynb` reads from its runs.

The experiments are `clusterlab.experiments.async_races`; each function here turns one
cell's runs into the figure and the sentences the learner reads, and checks what the text
claims.
"""

from __future__ import annotations

from .show import details, say

ASYNC_FIXES = ("wait_then_read", "wait_then_edit")


# --- Async collectives: touching a buffer before wait() ---------------------------------------

def _shares(ar: dict) -> dict:
    """What each element held after a read or an edit before wait(), as fractions of all
    elements of all rank-trials: {variant: [(label, share), ...]}, the shares summing to 1."""
    w, add = ar["workers"], ar["add"]
    total = w * (w + 1) // 2
    rd, ed = ar["variants"]["read_before_wait"], ar["variants"]["edit_before_wait"]
    partly = ed.get("edit_partly", 0.0)
    return {
        "read_before_wait": [
            ("this rank's own value", rd["local"]),
            ("a partial sum", rd["wrong_elements"] - rd["local"]),
            (f"the total, {total} (right)", 1 - rd["wrong_elements"])],
        "edit_before_wait": [
            (f"{total + w * add:g} (every rank's edit)", ed["edit_sent"]),
            (" or ".join(f"{total + k * add:g}" for k in range(2, w)) + " (some ranks' edits)",
             partly),
            (f"{total} (no edit)", ed["edit_lost"]),
            (f"{total + add:g} (right by chance)", 1 - ed["wrong_elements"]),
            # what is left; float round-off must not print as "-0.0%"
            ("anything else", max(0.0, ed["wrong_elements"] - ed["edit_sent"] - ed["edit_lost"]
                                  - partly))],
    }


def plot_async_races(ar: dict) -> None:
    """What the elements held after a read and after an edit before wait() (`_shares`): one
    stacked bar each, in % of all elements of all rank-trials."""
    import matplotlib.pyplot as plt

    shares = _shares(ar)
    fig, axes = plt.subplots(1, 2, figsize=(10, 2.4))
    for ax, (v, title) in zip(axes, (("read_before_wait", "A read before wait() saw"),
                                     ("edit_before_wait", "After an edit before wait(), g held"))):
        left, wrong_colors = 0.0, iter(("C0", "C1", "C3", "C4", "C7"))
        for label, share in shares[v]:  # right is green in both bars
            ax.barh(0, 100 * share, left=100 * left, label=f"{label} ({share:.1%})",
                    color="C2" if "right" in label else next(wrong_colors))
            left += share
        ax.set_xlim(0, 100)
        ax.set_yticks([])
        ax.set_title(f"{title}\n(% of all elements, {ar['trials']} trials x {ar['workers']} "
                     "ranks)", fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    plt.tight_layout()
    plt.show()


def agreeing_wrong_trials(ar: dict) -> int:
    """Trials whose ranks agreed on wrong values after an edit before wait(), at least: all
    trials, minus those whose ranks disagreed, minus the most that can have been all right
    (one per `workers` right reads). A replica checksum cannot catch these."""
    d = ar["variants"]["edit_before_wait"]
    return ar["trials"] - d["disagree_trials"] - (d["reads"] - d["wrong_trials"]) // ar["workers"]


def explain_async_races(ar: dict, ar1: dict) -> None:
    """What the early reads saw and what the early edits left (1 MiB bucket, `ar`), the
    trials a replica checksum would miss, the fixes' counts, and how many early reads happened
    to be right (also for a one-element tensor, `ar1`); asserts that touching before wait()
    went wrong and that the fixes never did."""
    v, shares = ar["variants"], _shares(ar)
    for name, what in (("read_before_wait", "read before wait()"),
                       ("edit_before_wait", "edit before wait()")):
        d = v[name]
        print(f"{what}: wrong in {d['wrong_trials']} of {d['reads']} rank-trials; of all "
              "elements: " + ", ".join(f"{share:.1%} {label}" for label, share in shares[name]
                                       if round(share, 3) > 0 or "right" in label) + ".")
    d = v["edit_before_wait"]
    agree_wrong = agreeing_wrong_trials(ar)
    if agree_wrong > 0:
        print(f"After the edit, every rank held the same wrong bytes in "
              f"{'' if d['wrong_trials'] == d['reads'] else 'at least '}{agree_wrong} of "
              f"{ar['trials']} trials: a replica checksum cannot catch those.")
    fixes = ASYNC_FIXES
    print(f"The fixes ({' and '.join(n.replace('_', ' ') for n in fixes)}): wrong in "
          f"{' and '.join(str(v[n]['wrong_trials']) for n in fixes)} of "
          f"{v[fixes[0]]['reads']} rank-trials.")
    rb, rb1 = v["read_before_wait"], ar1["variants"]["read_before_wait"]
    ok, ok1 = rb["reads"] - rb["wrong_trials"], rb1["reads"] - rb1["wrong_trials"]
    print(f"Reads before wait() that happened to be right: {ok} of {rb['reads']} (1 MiB bucket), "
          f"{ok1} of {rb1['reads']} (one element)"
          + (": such a read passes a test and fails on another run." if ok + ok1 else
             ": none on this run, but nothing orders the read after Gloo's write."))
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
        print(f"{r['hook']} hook: gradient wrong in {r['wrong_steps']} of {r['rank_steps']} "
              f"rank-steps ({r['workers']} ranks x {r['steps']} steps); replicas differed after "
              f"{r['differ_steps']} of {r['steps']} steps; rank 0's held-out loss "
              f"{r['loss_first']:.3g} -> {r['loss_last']:.3g}")
    if bad["wrong_steps"]:
        print(f"  In the unchained run's wrong rank-steps, {bad['unreduced']:.0%} of the "
              f"gradient's elements were this rank's own / {bad['workers']}: unreduced (counted "
              f"where own / {bad['workers']} differs from the true average).")
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
  ([[pytorch.nccl_blocking_wait]], or [[pytorch.nccl_wait_timeout_blocks]], makes it block the
  host). Ops then issued on the current stream are ordered after the collective. Work on
  another stream is not: it races with the collective, the same kind of race as the one
  measured above between your thread and Gloo's.
- **A copy to the host.** `x = t.to("cpu", non_blocking=True)` gives
  [[pytorch.non_blocking_d2h]]: a loss or metric logged from `x` can be incomplete or garbage.
  Synchronise first (`torch.cuda.synchronize()`, or `synchronize()` on an event recorded
  after the copy).
"""

# The rest, for the expert reader: shown folded by `show_more_gpu_races`.
GPU_RACES_MORE = """
- **Side streams.** The caching allocator (PyTorch's reuse of freed GPU memory) tracks
  only the stream a tensor was allocated on.
  Before a tensor used by side-stream work is freed, call [[pytorch.record_stream]] (the side
  stream), or make the tensor's own stream wait on an event recorded after that work, or
  keep the tensor alive until it is done; otherwise its memory goes to the next allocation
  while that work still reads it.
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
