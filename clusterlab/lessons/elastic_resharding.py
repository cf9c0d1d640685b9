"""What notebook 12b reads from its run: an elastic torchrun job that loses a node, and the
checkpoint it reshards.

The run is `clusterlab.experiments.elastic`'s (a job object with its rounds, failure and
resharding as plain dicts); here it becomes the sentences the learner reads and the checks
that the run showed what the text says. The ledger-cited texts of "On a real GPU cluster" are
templates for `facts.show`.
"""

from __future__ import annotations


def settings_line(cfg: dict) -> str:
    """The rendezvous timeouts of this run (last call, when a silent node is dropped) beside
    torch's defaults from the ledger."""
    from .. import facts

    return (f"here: last call {cfg['last_call_s']} s, a silent node dropped after "
            f"{cfg['keep_alive_s'] * cfg['keep_alive_attempts']} s (keep-alive: "
            f"{cfg['keep_alive_s']} s × {cfg['keep_alive_attempts']}); torch's defaults: "
            f"{facts.get('pytorch.rdzv_last_call_timeout').text} and "
            f"{facts.get('pytorch.rdzv_dead_node_after').text}")


def group_lines(rounds: list[dict]) -> list[str]:
    """Each rendezvous round's group in words: its world size, the steps it ran (naming the
    steps an earlier group had completed, run again now) and where it started, from scratch
    or from which checkpoint written by how many ranks."""
    lines = []
    done = 0  # the last step completed by an earlier group
    for i, r in enumerate(rounds):
        origin = (f"from the step-{r['loaded']['step']} checkpoint written by "
                  f"{r['loaded']['world']} ranks" if r["loaded"] else "from scratch")
        redo = list(range(r["from_step"] + 1, done + 1))  # completed before, run again now
        again = (f" (step{'s' * (len(redo) > 1)} {', '.join(map(str, redo))} redone)"
                 if redo else "")
        lines.append(f"group {i}: world size {r['world']}, steps {r['from_step'] + 1} to "
                     f"{r['to_step']}{again}, {origin}")
        done = max(done, r["to_step"])
    return lines


def restart_line(rounds: list[dict], max_restarts: int) -> str:
    """How many of its restarts node A's agent had spent when it started each group's worker
    (the worker's TORCHELASTIC_RESTART_COUNT, which torch sets to max_restarts less the
    restarts left)."""
    spent = ", ".join(f"{r['restart']} for group {i}" for i, r in enumerate(rounds))
    return (f"restarts node A's agent had spent (its worker's TORCHELASTIC_RESTART_COUNT): "
            f"{spent}, of {max_restarts} allowed")


def explain_groups(run) -> None:
    """Print `group_lines` of the job's rendezvous rounds and `restart_line` (the agents' exit
    codes and the processes left afterwards are `check_run`'s to assert)."""
    for line in group_lines(run.rounds()):
        print(line)
    print(restart_line(run.rounds(), run.config["max_restarts"]))


def pause_lines(f: dict, cfg: dict) -> list[str]:
    """The pause after node B's death in words: what node A's worker was told, then each
    milestone in seconds after the kill with the time it added: A's worker told; A's agent has
    created the new worker (its restart and the rendezvous without B, whose configured waits
    are named; that each is noticed at a once-a-second poll is the notebook's fold); that
    worker's Python has imported torch; it has imported DCP and FSDP; it has loaded the
    checkpoint at the new world size."""
    keep_alive = cfg["keep_alive_s"] * cfg["keep_alive_attempts"]
    marks = [
        (f["detected_s"], f"A's worker is told, in its next collective (after its "
                          f"{cfg['compute_s']} s compute sleep)"),
        (f["spawned_s"], f"A's agent has started a new worker (+{{:.1f}} s): its restart and "
                         f"the rendezvous without B,\nwhose waits are B's heartbeats expiring "
                         f"({keep_alive} s after its last one, sent before the kill), then the "
                         f"last call ({cfg['last_call_s']} s)"),
        (f["regrouped_s"], "its Python has started and imported torch (+{:.1f} s)"),
        (f["imported_s"], "it has imported DCP and FSDP (+{:.1f} s)"),
        (f["resumed_s"], f"it has loaded the checkpoint at world size {f['world_after']} "
                         f"(+{{:.1f}} s)"),
    ]
    lines = [f"node B died before step {f['step'] + 1}; node A's worker was told: "
             f"{f['error'].split('. ')[0]}",
             "the pause, in seconds after the kill (one run):"]
    before = 0.0
    for t, text in marks:
        first, *more = text.format(t - before).split("\n")  # more: indented under first
        lines += [f"  {t:5.2f}  {first}"] + [" " * 9 + line for line in more]
        before = t
    return lines


def explain_pause(f: dict, cfg: dict) -> None:
    """Print `pause_lines(f, cfg)`: how the pause after the death splits, after a blank line
    that sets it apart from the groups above it (the pause is what the learner predicted)."""
    print()
    for line in pause_lines(f, cfg):
        print(line)


def shrink_line(run) -> str:
    """The run's point in one line, from its failure record: after which step node B died,
    the world sizes before and after, the checkpoint the job resumed from and when, in seconds
    after the kill."""
    f = run.failure()
    return (f"What this shows: node B died after step {f['step']}, and the job went on at "
            f"world size {f['world_after']} (was {f['world_before']}) from the "
            f"step-{f['resumed_from']} checkpoint, {f['resumed_s']:.1f} s after the kill.")


def check_run(run) -> None:
    """Assert what the text says of the run: agent A ended cleanly and B was SIGKILLed, no
    process left; the job went from world size 2 to 1 resuming from the step-6 checkpoint; A's
    worker failing cost its agent at least one restart, within its budget (a CI run's count
    was not exactly one; the run prints the count); the milestones come in order, and the
    rendezvous took at least its last call (its deadline is set once A has joined the new
    round, after its worker failed)."""
    f = run.failure()
    assert run.returncodes == {"A": 0, "B": -9}, f"agents' exit codes {run.returncodes}"
    assert not run.leftover, f"processes of the job left afterwards: {run.leftover}"
    assert (f["world_before"], f["world_after"], f["resumed_from"]) == (2, 1, 6)
    spent = run.rounds()[-1]["restart"]
    assert 1 <= spent <= run.config["max_restarts"], (
        f"the failure cost A's agent {spent} restarts: at least one, within its budget")
    assert f["detected_s"] < f["spawned_s"] < f["regrouped_s"] < f["resumed_s"]
    assert f["spawned_s"] - f["detected_s"] >= run.config["last_call_s"] - 0.01, (
        "the rendezvous waited its last call")


def shard_lines(rs: dict) -> list[str]:
    """Each tensor's shard shapes per rank in the checkpoint beside its loaded shape (asserted:
    the shards' rows add up to it), then which tensors one rank held whole (an empty shard on
    the other), and whether the loaded parameters and Adam's moments equal the saved ones bit
    for bit."""
    per_rank = rs["saved_rank_shapes"]  # every rank's shard shapes in the step-6 checkpoint
    lines = []
    for name, whole in rs["loaded_shapes"].items():
        held = ", ".join(f"rank {r} {tuple(s[name])}" for r, s in enumerate(per_rank))
        lines.append(f"{name:>9}: at world size {rs['saved_world']} {held}; "
                     f"at world size {rs['loaded_world']} {tuple(whole)}")
        assert sum(s[name][0] for s in per_rank) == whole[0], (
            "the shards' rows add up to the tensor")
    empty = [n for n in rs["loaded_shapes"] if any(s[n][0] == 0 for s in per_rank)]
    lines.append(f"held whole by one rank, an empty shard on the other: "
                 f"{', '.join(empty) or 'none'}")
    lines.append(f"loaded at world size 1 equal to those saved at world size 2, bit for bit: "
                 f"parameters {rs['identical']}; Adam's moments (exp_avg and exp_avg_sq: "
                 f"2 × {rs['moments'] // 2} parameters = {rs['moments']} numbers) "
                 f"{rs['moments_identical']}")
    return lines


def explain_shards(rs: dict) -> None:
    """Print `shard_lines(rs)`: who held which rows before, what one rank holds after."""
    for line in shard_lines(rs):
        print(line)


def rerun_line(losses: list[tuple], step: int) -> str:
    """The loss of the step that ran twice, once per world size it ran at."""
    twice = [(w, loss) for s, w, loss in losses if s == step]
    return f"step {step} ran twice: loss " + " and ".join(f"{loss:.6f} at world size {w}"
                                                         for w, loss in twice)


def reshard_line(rs: dict, err: float) -> str:
    """The resharding's point in one line: what the new world size loaded from the old one's
    checkpoint, whether it equals what was saved bit for bit, and the final parameters'
    largest difference from one plain process that never lost a node."""
    same = rs["identical"] and rs["moments_identical"]
    return (f"What this shows: at world size {rs['loaded_world']} the job loaded the "
            f"checkpoint written by {rs['saved_world']} ranks, parameters and Adam's moments "
            f"{'equal' if same else 'NOT equal'} to those saved, bit for bit; it ended within "
            f"{err:.0e} of a run without the failure.")


def check_resharding(rs: dict, err: float) -> None:
    """Assert the resharding: the loaded parameters and moments equal the saved ones, the end
    matches a plain process within 1e-5, the first layer's rows split in two, and the output
    layer's single row sits on rank 0 with none on rank 1."""
    per_rank = rs["saved_rank_shapes"]
    assert rs["identical"] and rs["moments_identical"] and err < 1e-5
    assert rs["saved_shapes"]["0.weight"][0] * 2 == rs["loaded_shapes"]["0.weight"][0]
    assert [s["2.weight"][0] for s in per_rank] == [1, 0], "one row: all on rank 0, none on rank 1"


def checkpoint_lines(keys: list[str], step: int) -> list[str]:
    """What one checkpoint of the run holds, from its DCP metadata's keys (`keys`, flattened
    as "model.0.weight", "optim.state.0.weight.exp_avg", "optim.param_groups.0.lr"): the
    top-level keys with the parameters and Adam's per-parameter entries and settings under
    them, then what it does not hold and why this demo needs none of it."""
    top: dict[str, list[str]] = {}
    for k in keys:
        head, _, rest = k.partition(".")
        top.setdefault(head, []).append(rest)
    assert set(top) == {"model", "optim"}, f"top-level keys {sorted(top)}"
    state = [r.split(".")[-1] for r in top["optim"] if r.startswith("state.")]
    params = top["model"]
    settings = sorted({r.split(".")[-1] for r in top["optim"] if r.startswith("param_groups.")}
                      - {"params"})
    kinds = list(dict.fromkeys(state))
    assert len(state) == len(kinds) * len(params), "Adam keeps each entry per parameter"
    assert "lr" in settings
    return [f"this run's step-{step} checkpoint, read from its DCP metadata: "
            f"{len(top)} top-level keys",
            f"  model: {', '.join(params)}",
            f"  optim: {', '.join(kinds)} for each of those {len(params)} parameters, and "
            f"Adam's {len(settings)} settings (lr among them)",
            "not in it: a learning-rate schedule, the data position, random-number states. "
            "This demo needs none:",
            "  a constant learning rate, and each batch is a function of the step (the "
            f"directory's name, ckpt-{step:04d}, gives the step)"]


def explain_checkpoint(run, step: int) -> None:
    """Print `checkpoint_lines` for the run's checkpoint of `step` (the one the smaller
    group loaded)."""
    for line in checkpoint_lines(run.saved_keys[step], step):
        print(line)


def sampler_positions(n: int, *, examples: int, batch: int, skip: int) -> list[int]:
    """The positions in `DistributedSampler`'s shuffled order (seed 0, epoch 0) of the
    examples that `n` ranks train on after each skips its first `skip` batches of `batch`,
    for one more batch each: what a per-rank batch count resumes with. The order is the one
    `num_replicas=1` gives, the same for every n (it depends on the seed and epoch alone)."""
    from torch.utils.data import DistributedSampler

    data = range(examples)
    order = list(DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0))
    where = {example: i for i, example in enumerate(order)}
    out = []
    for r in range(n):
        mine = list(DistributedSampler(data, num_replicas=n, rank=r, shuffle=True, seed=0))
        out += [where[e] for e in mine[skip * batch:(skip + 1) * batch]]
    return sorted(out)


def sampler_lines(*, before: int, after: int, batch: int, examples: int = 24) -> list[str]:
    """One step at `before` ranks, then a resume at `after` ranks that skips one batch per
    rank (as a per-rank batch count does): which positions of the sampler's order the first
    step used, which the resumed step trains, and which it skips or repeats; then what
    counting global examples gives."""
    done = sampler_positions(before, examples=examples, batch=batch, skip=0)
    assert done == list(range(before * batch)), "one batch per rank covers the first n × B"
    now = sampler_positions(after, examples=examples, batch=batch, skip=1)
    repeated = sorted(set(now) & set(done))
    first_new = before * batch
    skipped = [i for i in range(first_new, min(now)) if i not in now]
    span = lambda xs: f"{xs[0]}-{xs[-1]}" if len(xs) > 1 else str(xs[0])  # noqa: E731
    return [f"{before} ranks, batch {batch} each: step 1 trains positions {span(done)} of the "
            f"sampler's shuffled order",
            f"{after} ranks, resumed by skipping 1 batch per rank: step 2 trains positions "
            f"{', '.join(map(str, now))}",
            f"  repeated: {', '.join(map(str, repeated)) or 'none'}; skipped: "
            f"{', '.join(map(str, skipped)) or 'none'}",
            f"resumed by counting global examples ({first_new} used): step 2 starts at "
            f"position {first_new}; nothing repeated or skipped"]


def explain_sampler(*, before: int, after: int, batch: int) -> None:
    """Print `sampler_lines`: a per-rank batch count against a global example count."""
    for line in sampler_lines(before=before, after=after, batch=batch):
        print(line)


def death_text(f: dict, cfg: dict) -> str:
    """The `facts.show` template of "How a death reaches the job": the pause at the defaults
    (from the ledger) beside this run's parts in a table, the `--max-restarts` default, and in a
    fold the steps under NCCL over InfiniBand, how this run's survivor heard of the death (its
    measured delay and compute sleep), and the rendezvous host."""
    from .. import facts

    ib_wait = facts.get("nccl.ib_total_wait_default").value  # s, nominal
    tries = 1 + facts.get("nccl.ib_retry_cnt_default").value  # the first try and the retries
    ack_s = facts.get("nccl.ib_timeout_default_time").value  # s, one ACK timeout, nominal
    exp = facts.get("nccl.ib_timeout_default").value  # NCCL_IB_TIMEOUT, an exponent
    assert abs(4.096e-6 * 2**exp - ack_s) < 0.05, "the ACK timeout is 4.096 µs × 2^exponent"
    assert abs(tries * ack_s - ib_wait) < 1, "the total wait is the tries' ACK timeouts"
    nccl_min = facts.get("pytorch.nccl_timeout_default").value  # min
    dead_after = facts.get("pytorch.rdzv_dead_node_after").value  # s
    last_call = facts.get("pytorch.rdzv_last_call_timeout").value  # s
    assert ib_wait > dead_after, "by the first failure the dead node's heartbeats are overdue"
    keep_alive = cfg["keep_alive_s"] * cfg["keep_alive_attempts"]
    rdzv = f["spawned_s"] - f["detected_s"]  # this run: A's agent and the rendezvous
    start = f["resumed_s"] - f["spawned_s"]  # this run: the new worker, up to the loaded state
    # Step 2: a sender's unacknowledged data, or a receiver's "you may send" (an RDMA write,
    # ncclIbPostFifo in NCCL v2.30's src/transport/net_ib/p2p.cc), waits for an ACK.
    return f"""
**How a death reaches the job**

On a cluster the pause has the same parts, with longer waits. NCCL has no heartbeat that fails a
collective: a survivor hangs until its NIC gives up resending to the dead node (over InfiniBand
at NCCL's defaults, {tries} tries of {ack_s} s each, about {ib_wait:.0f} s: timers of
[13](13_switches_incast_ecmp_rails.ipynb)) or until PyTorch's watchdog
thread ends a collective that outlasts the process group's timeout ({nccl_min:.0f} min). By then the dead node's heartbeats have expired (they do after
{dead_after:.0f} s), so the rendezvous only waits its last call ({last_call:.0f} s). Then every
worker restarts and loads the checkpoint. This run's whole pause took {f['resumed_s']:.1f} s.

| part of the pause | NCCL over InfiniBand, torch's defaults | this run (Gloo, a killed process; one run) |
|---|---|---|
| noticing the death | about {ib_wait:.0f} s (step 2 below), or {nccl_min:.0f} min (the watchdog) | {f['detected_s'] * 1e3:.0f} ms |
| agent and rendezvous: dropping the dead node, then the last call | 0 s (its {dead_after:.0f} s without heartbeats have passed) + {last_call:.0f} s | {rdzv:.1f} s (configured: at most {keep_alive} s, then {cfg['last_call_s']} s) |
| new workers, communicator, checkpoint load | not counted: grows with the job and the checkpoint | {start:.1f} s (incl. this demo's check) |
| **total** | **more than {ib_wait + last_call:.0f} s** | **{f['resumed_s']:.1f} s** |

All of this assumes `--max-restarts` of at least 1. Its default is
[[pytorch.torchrun_max_restarts_default]]: then the agent of the first survivor whose worker
fails stops its workers and exits, and the job does not resume.

<details><summary>Step by step: the six steps under NCCL, why this run heard in {f['detected_s'] * 1e3:.0f} ms, the rendezvous host</summary>

- **Under NCCL over InfiniBand, at the defaults** (the cases are tabled in
  [12](12_failures_and_elasticity.ipynb)'s *On a real GPU cluster*):
  1. **The survivors hang, and look healthy.** An NCCL call
     [[pytorch.collective_returns_before_cuda_completes]], so the GPU's kernel waits in the collective and the worker's host thread
     at its next synchronisation with it. Their agents, which poll them every
     `--monitor-interval` ([[pytorch.torchrun_monitor_interval]]), see them healthy.
  2. **The first peer times out after about {ib_wait:.0f} s.** A NIC with data in flight to the
     dead node gets no receipt (ACK); it retries [[nccl.ib_retry_cnt_default]] times
     (NCCL_IB_RETRY_CNT), waiting [[nccl.ib_timeout_formula]] each time, with
     NCCL_IB_TIMEOUT = [[nccl.ib_timeout_default]]: {tries} × {ack_s} s ≈ [[nccl.ib_total_wait_default]].
     That is the nominal value; RoCE NICs with adaptive retransmission time their retries
     differently (their timer's maximum is [[nvidia.roce_adp_timeout_cap]]). The mechanism is in
     [13](13_switches_incast_ecmp_rails.ipynb). Then the NIC reports an error.
  3. **That worker fails.** ProcessGroupNCCL's watchdog polls the communicator's errors and,
     with TORCH_NCCL_ASYNC_ERROR_HANDLING at torchrun's setting
     ([[pytorch.torchrun_async_error_handling]]; without torchrun the default is
     [[pytorch.nccl_async_error_handling]]; both end the process, 0 would leave it hanging),
     ends the worker. Its agent spends a restart (if one is left) and re-enters the
     rendezvous.
  4. **Every other agent restarts its workers.** It sees a node waiting at its next poll and
     stops its hung workers: SIGTERM, then SIGKILL after up to [[pytorch.agent_stop_grace]].
  5. **The round drops the dead node and waits the last call.** By then the dead node's
     heartbeats are overdue (a node is dropped after [[pytorch.rdzv_dead_node_after]] without
     them at torch's defaults), so it leaves at once; the round, once it has its minimum,
     waits the last call, [[pytorch.rdzv_last_call_timeout]]. An agent re-reads the rendezvous
     once a second, so each wait may end up to a second late.
  6. **New workers start and load the checkpoint:** interpreters, CUDA, and NCCL's
     communicator (its set of connections over all ranks of the new group).

  If no peer has traffic in flight to the dead node, step 2 is the timeout of
  ProcessGroupNCCL's watchdog (a thread that ends the process when a collective overruns),
  [[pytorch.nccl_timeout_default]] by default.
- **The same mechanism as this run.** What ran here is an elastic torchrun,
  [[pytorch.torchrun_elastic]], and any change of membership stops every worker:
  [[pytorch.torchrun_restarts_all]]. In the agent's code ("[[pytorch.agent_restart_budget]]")
  `--max-restarts` counts failures only: an agent whose own worker fails spends one; an agent
  that restarts because another node joined or is waiting spends none. torchrun's own docs
  say its elastic example "[[pytorch.torchrun_docs_max_restarts]]": trust the code.
- **Noticing the death differs.** Here the survivor heard of it
  {f['detected_s'] * 1e3:.0f} ms after the kill: the kernel closed the killed process's TCP connections at once, and A's worker found
  them closed in its next collective, after its compute sleep of {cfg['compute_s']} s. A powered-off
  node closes nothing: under Gloo its peers fail at the latest at the process group's timeout,
  [[pytorch.gloo_timeout_default]] by default ({cfg['collective_timeout_s']:.0f} s in this run).
- **The rendezvous host.** With the c10d backend one agent runs the store that holds the
  rendezvous state ([[pytorch.c10d_rendezvous_host]]). Here node A hosted it and node B died;
  had A died, B would have lost the rendezvous with it: whatever `--nnodes` allows, that node
  is a single point of failure. To keep it off the training nodes, host the store on
  another machine (`--rdzv-conf is_host=0` on every agent, and there a small process of
  your own holding `TCPStore(is_master=True)`: with `is_host=0` no agent starts one) or use
  [[pytorch.rdzv_etcd_backend]] with a replicated etcd cluster.

</details>
"""  # noqa: E501 (Markdown table rows and prose shown verbatim)


def cost_text() -> str:
    """The `facts.show` template of "What a smaller job costs": resharding, a lower bound on
    loading the checkpoint (Adam's state for 70B and 405B parameters read once at Llama 3's
    whole storage rate), uneven shards, and shrinking by a whole data-parallel replica (a
    table of R replicas of k nodes, one node dead)."""
    from .. import facts

    adam_b = facts.get("paper.zero_adam_state_bytes").value  # optimizer state per parameter
    tb_s = facts.get("meta.llama3_storage_throughput").value  # TB/s, sustained
    floor = (facts.get("nccl.ib_total_wait_default").value
             + facts.get("pytorch.rdzv_last_call_timeout").value)  # s, as in death_text
    read_s = 405e9 * adam_b / 1e12 / tb_s  # one copy of the 405B state, at the whole fabric's rate
    return f"""
**What a smaller job costs**

- **Resharding is DCP's** ([[pytorch.dcp_resharding]]). The checkpoint must sit on storage
  every node reaches (here: one local directory).
- **Loading reads the whole state at least once.** Its optimizer part alone, fp32 weights
  and Adam's two moments, takes [[paper.zero_adam_state_bytes]]: about {70e9 * adam_b / 1e12:.1f} TB for a 70B-parameter model,
  {405e9 * adam_b / 1e12:.1f} TB for 405B. Even at Llama 3's whole storage rate, a sustained
  [[meta.llama3_storage_throughput]], reading 405B's state once takes no less than {read_s:.1f} s
  (small beside the {floor:.0f} s floor), and {read_s * 100 / 60:.0f} min on storage a hundred
  times slower. A real load adds metadata, planning, deserialising and copies to the GPUs.
  This tiny model does not show it.

  <details><summary>The caveats</summary>

  The 12 bytes are fp32 master weights and Adam's two fp32 moments, the usual mixed precision
  computing in 16 bits. A checkpoint that also stores the 16-bit weights is larger; one with
  16- or 8-bit optimizer states is smaller. Loading reads at least that size, a multiple of
  it when each data-parallel replica reads its own copy, and a job that gets less of the
  fabric, or whose nodes' NICs are slower than their share of it, waits longer.
  </details>

- **Uneven shards:** a tensor with fewer rows than ranks leaves some ranks an empty shard, as
  the output layer above ([[pytorch.fsdp2_shard_dim0_chunk]]); FSDP pads the parameter buffer,
  but Adam's moments and the checkpoint files stay uneven.
- **A job shrinks by a whole data-parallel replica, if the script makes it.** torchrun hands
  the script every surviving node. Say each of R replicas spans k nodes, with tensor and
  pipeline parallelism ([10b](10b_tensor_pipeline_expert_parallelism.ipynb)) in a fixed
  layout per replica, and one node dies:

  | | replicas training | nodes training | nodes idle |
  |---|---|---|---|
  | before | R | R × k | 0 |
  | after | R − 1 | (R − 1) × k | k − 1 (the surviving nodes of the dead node's replica) |

  The job runs at about (R − 1)/R of the throughput, with a larger per-replica batch or
  gradient accumulation. To keep the survivors busy, re-partition the pipeline stages over
  them, or put a spare node in the dead one's place.
"""  # noqa: E501 (Markdown table rows and prose shown verbatim)
