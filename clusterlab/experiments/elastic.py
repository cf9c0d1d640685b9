"""Elasticity: a node dies, the job continues on fewer nodes from a resharded checkpoint.

`elastic_job` starts two torchrun agents on this machine, each standing for one node with
one worker: `torchrun --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d --max-restarts K`,
agent A hosting the rendezvous store (`--rdzv-conf is_host=1`), as on two hosts (see
tests/test_multihost.py and docs/real_cluster.md). The workers train a small MLP sharded
with FSDP2 (`fully_shard` on a CPU device mesh over Gloo: each rank holds half of every
parameter and of Adam's state as DTensor shards) and save a torch.distributed.checkpoint
(DCP) every `interval` steps, one file per rank. At `kill_step`, node B dies: its worker
SIGKILLs its own agent and itself. A's worker gets an error from Gloo, A's agent re-enters
the rendezvous, which drops B once B's keep-alive heartbeats stop, and, since one node is
within 1:2, starts a new group of world size 1. Its worker loads the last checkpoint, which
two ranks wrote as two shards, into a model sharded one way: DCP reshards on load.

What is checked: the parameters the world-1 worker loaded equal the parameters the world-2
group saved (bit for bit), and the job's final parameters equal those of a plain
single-process training on the same data (to float rounding): the global batch and the data
order are functions of the step, so losing a node changes who computes, not what.

Gloo on loopback, not the course's "netem" backend: the network is not the subject here,
and a killed process's sockets are closed by the kernel (its peers get a reset at once; a
powered-off node sends nothing, see notebook 12b). Every wait has a timeout; the agents run
in their own sessions and every process of the job (found by its marker in the
environment) is killed at the end, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from .common import marked_processes
from .failures import scratch_dir

JOB_ENV = "CLUSTERLAB_ELASTIC_JOB"  # the job's config file; also marks its processes
NODE_ENV = "CLUSTERLAB_ELASTIC_NODE"
DEFAULTS = dict(steps=12, interval=3, kill_step=7, compute_s=0.05, width=32, features=16,
                batch=64, lr=1e-2, max_restarts=2, last_call_s=2, keep_alive_s=1,
                keep_alive_attempts=2, collective_timeout_s=20.0, timeout_s=150.0)


# --- the model and data: the same for the workers and the single-process reference ----------


def _model(cfg: dict):
    import torch

    torch.manual_seed(0)  # every rank builds the same full model, then FSDP keeps its shard
    return torch.nn.Sequential(torch.nn.Linear(cfg["features"], cfg["width"]), torch.nn.Tanh(),
                               torch.nn.Linear(cfg["width"], 1))


def _batch(cfg: dict, step: int):
    """The global batch of `step`: a function of the step alone (the data loader's state is
    the step, saved with the checkpoint), so a redone step sees the same data."""
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(cfg["batch"], cfg["features"], generator=g)
    return x, x.sum(1, keepdim=True).sin()


def reference_params(cfg: dict):
    """The parameters after cfg["steps"] full-batch Adam steps in one plain process."""
    import torch

    model = _model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    for step in range(cfg["steps"]):
        x, y = _batch(cfg, step)
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


# --- the worker ----------------------------------------------------------------------------------


def _started_ns(pid: int | str = "self") -> int:
    """When process `pid` was created (forked by its parent), on time.monotonic_ns()'s clock,
    to a clock tick (10 ms at 100 Hz), truncated. /proc/<pid>/stat's field 22 is the start
    time in ticks since boot on CLOCK_BOOTTIME, which runs ahead of CLOCK_MONOTONIC by the
    time the machine spent suspended: that offset is subtracted."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # fields after "(comm)" start at field 3
    offset = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    return ticks * 10**9 // os.sysconf("SC_CLK_TCK") - offset


def _worker() -> None:
    """One torchrun worker (run as `python -m clusterlab.experiments.elastic`)."""
    cfg = json.loads(Path(os.environ[JOB_ENV]).read_text())
    node = os.environ[NODE_ENV]
    work = Path(cfg["dir"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(work / f"events-{node}.jsonl", "a", buffering=1) as log:

        def event(kind: str, **data) -> None:
            log.write(json.dumps({"kind": kind, "t": time.monotonic_ns(), "node": node,
                                  "restart": restart, "pid": os.getpid(), **data}) + "\n")

        # this module runs: the interpreter has started and imported clusterlab, hence torch;
        # `started`: when the agent created this process, before the interpreter started
        event("process", started=_started_ns())
        try:
            _train(cfg, node, work, event)
        except Exception as exc:
            from .common import _tidy

            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            event("error", error=_tidy(lines[0]) if lines else type(exc).__name__)
            raise


def _train(cfg: dict, node: str, work: Path, event) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    event("imported")  # torch.distributed's DCP, state_dict, device mesh and FSDP modules loaded
    dist.init_process_group("gloo", timeout=timedelta(seconds=cfg["collective_timeout_s"]))
    event("group")  # the process group exists (its store was set up by this rendezvous)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model(cfg)
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])

    def full_params():  # an all-gather of every shard: every rank must call it
        return torch.cat([p.full_tensor().detach().flatten() for p in model.parameters()])

    def full_moments():  # Adam's exp_avg and exp_avg_sq, all-gathered like the parameters
        return torch.cat([opt.state[p][k].full_tensor().detach().flatten()
                          for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")])

    def shapes():
        return {k: list(v.to_local().shape) for k, v in model.state_dict().items()}

    step, loaded = 0, None
    done = sorted(work.glob("ckpt-*/.metadata"))  # DCP writes .metadata last: complete ones
    if done:
        path = done[-1].parent
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)  # each rank reads the pieces of its new shard
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        step = int(path.name.split("-")[1])
        loaded = json.loads((path / "saved.json").read_text())
    params = full_params()
    moments = full_moments() if loaded else None
    if rank == 0:
        torch.save(params, work / f"resume-params-{os.getpid()}.pt")
        if loaded:
            torch.save(moments, work / f"resume-moments-{os.getpid()}.pt")
    event("resume", step=step, world=world, rank=rank, shapes=shapes(), loaded=loaded)
    while step < cfg["steps"]:
        if node == "B" and world == 2 and step == cfg["kill_step"]:
            event("kill", step=step, world=world)  # line-buffered: on disk before we die
            os.kill(os.getppid(), signal.SIGKILL)  # the node's agent...
            os.kill(os.getpid(), signal.SIGKILL)  # ...and its worker: the node is gone
        time.sleep(cfg["compute_s"])  # the accelerator's forward and backward
        x, y = _batch(cfg, step)
        xb, yb = x.chunk(world)[rank], y.chunk(world)[rank]  # this rank's share of the batch
        loss = ((model(xb) - yb) ** 2).mean()
        loss.backward()  # FSDP reduce-scatters the gradient: the mean over ranks
        opt.step()
        opt.zero_grad()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        step += 1
        event("step", step=step, world=world, loss=float(mean_loss) / world)
        if step % cfg["interval"] == 0 and step < cfg["steps"]:
            t0 = time.monotonic_ns()
            msd, osd = get_state_dict(model, opt)
            path = work / f"ckpt-{step:04d}"
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)  # a shard per rank
            params, moments = full_params(), full_moments()
            every = [None] * world  # each rank's shard shapes: dim 0 is split like torch.chunk
            dist.all_gather_object(every, shapes())
            if rank == 0:
                torch.save(params, path / "params.pt")
                torch.save(moments, path / "moments.pt")
                (path / "saved.json").write_text(json.dumps(
                    {"step": step, "world": world, "shapes": shapes(), "rank_shapes": every}))
            dist.barrier()
            event("checkpoint", step=step, world=world,
                  seconds=(time.monotonic_ns() - t0) / 1e9)
    params = full_params()
    if rank == 0:
        torch.save(params, work / "final.pt")
    event("done", step=step, world=world)
    dist.destroy_process_group()


# --- the parent: two agents, their events ----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_processes(config_path: str) -> list[int]:
    """Live processes that carry this job's marker in their environment."""
    return marked_processes(JOB_ENV, config_path)


def _kill_all(procs: dict, config_path: str) -> None:
    """SIGKILL the agents' sessions and every process of the job (torchrun starts each
    worker in a session of its own, so killing an agent's session does not reach it)."""
    for proc in procs.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for pid in job_processes(config_path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


@dataclass
class ElasticRun:
    """A finished elastic job: its configuration, the agents' exit codes, its events and the
    parameters it saved, loaded and ended with (flat tensors, for comparison)."""

    config: dict
    returncodes: dict  # node -> exit code of its agent (B's is -9: it was killed)
    wall_s: float
    events: list[dict]
    leftover: list[int]  # processes of the job alive after it ended (none expected)
    saved: dict = field(default_factory=dict)  # checkpoint step -> full parameters saved
    resumed: dict = field(default_factory=dict)  # worker pid -> full parameters loaded
    saved_moments: dict = field(default_factory=dict)  # checkpoint step -> Adam's moments saved
    resumed_moments: dict = field(default_factory=dict)  # worker pid -> Adam's moments loaded
    saved_keys: dict = field(default_factory=dict)  # checkpoint step -> its DCP metadata's keys
    final: object = None
    reference: object = None

    def _of(self, kind: str, **match) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind
                and all(e.get(k) == v for k, v in match.items())]

    @property
    def t0(self) -> int:
        return min(e["t"] for e in self.events)

    def rounds(self) -> list[dict]:
        """Per group the job ran (one worker process of node A each): its world size, the
        step it started from and the last step it completed."""
        out = []
        for res in self._of("resume", node="A"):  # one worker process per group
            steps = [e["step"] for e in self._of("step", node="A", pid=res["pid"])]
            out.append({"restart": res["restart"], "world": res["world"],
                        "from_step": res["step"],
                        "to_step": max(steps) if steps else res["step"],
                        "loaded": res["loaded"]})
        return out

    def failure(self) -> dict:
        """The node's death and the recovery, from the events (seconds on the shared clock):
        detected_s: kill to the survivor's error; spawned_s: kill to the creation of the new
        group's worker process, to a clock tick (the agent stopping the old worker, the
        rendezvous round without the dead node, incl. its keep-alive expiry and the last call);
        regrouped_s: kill to this module's code running in that worker (after the interpreter's
        start-up and its import of clusterlab, hence of torch); imported_s, group_s: kill to
        torch.distributed's DCP and FSDP modules imported and to the process group created in
        that worker; resumed_s: kill to the checkpoint loaded at
        the new world size (after the resharding load and one all-gather of the parameters)."""
        (kill,) = self._of("kill")

        def first(kind: str) -> dict | None:
            later = [e for e in self._of(kind, node="A") if e["t"] > kill["t"]]
            return later[0] if later else None

        def since(e: dict | None) -> float | None:
            return (e["t"] - kill["t"]) / 1e9 if e else None

        err, res, proc = first("error"), first("resume"), first("process")
        out = {"step": kill["step"], "world_before": kill["world"],
               "world_after": res["world"] if res else None,
               "resumed_from": res["step"] if res else None,
               "error": err["error"] if err else None, "detected_s": since(err),
               "spawned_s": ((proc["started"] - kill["t"]) / 1e9
                             if proc and proc.get("started") else None),
               "regrouped_s": since(proc), "imported_s": since(first("imported")),
               "group_s": since(first("group")), "resumed_s": since(res)}
        return out

    def resharding(self) -> dict:
        """The checkpoint the smaller group loaded: who wrote it, how each parameter was
        split then (rank 0's shapes, and every rank's in `saved_rank_shapes`) and now, and
        whether the loaded parameters and Adam's moments (exp_avg, exp_avg_sq) are the saved
        ones."""
        import torch

        f = self.failure()
        res = [e for e in self._of("resume", node="A") if e["loaded"]
               and e["t"] > self._of("kill")[0]["t"]][0]
        step = res["loaded"]["step"]
        return {"step": step, "saved_world": res["loaded"]["world"],
                "loaded_world": f["world_after"], "saved_shapes": res["loaded"]["shapes"],
                "saved_rank_shapes": res["loaded"]["rank_shapes"], "loaded_shapes": res["shapes"],
                "identical": bool(torch.equal(self.saved[step], self.resumed[res["pid"]])),
                "moments_identical": bool(torch.equal(self.saved_moments[step],
                                                      self.resumed_moments[res["pid"]])),
                "moments": int(self.saved_moments[step].numel())}

    def step_seconds(self, world: int) -> list[float]:
        """Seconds between consecutive steps node A's worker completed at world size `world`,
        leaving out the steps that followed a checkpoint (their time includes the save)."""
        saved = {e["step"] for e in self._of("checkpoint", node="A")}
        st = [e for e in self._of("step", node="A") if e["world"] == world]
        return [(b["t"] - a["t"]) / 1e9 for a, b in zip(st, st[1:], strict=False)
                if b["pid"] == a["pid"] and b["step"] == a["step"] + 1 and a["step"] not in saved]

    def final_error(self) -> float:
        """Largest |difference| between the job's final parameters and the single-process
        reference's."""
        return float((self.final - self.reference).abs().max())

    def losses(self) -> list[tuple[int, int, float]]:
        """(step, world, loss) of every step node A completed, in order."""
        return [(e["step"], e["world"], e["loss"]) for e in self._of("step", node="A")]

    def plot_timeline(self, ax=None):
        """Steps completed over time, in seconds after node B's kill (so the pause's bands
        start at 0 and end at the milestones the notebook prints), coloured by world size; the
        kill and checkpoints, group 0's start-up and the pause's parts as bands."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 3))
        (kill,) = self._of("kill")

        def x(t: int) -> float:  # seconds after the kill
            return (t - kill["t"]) / 1e9

        for node, marker in (("A", "o"), ("B", "s")):
            for world, colour in ((2, "C0"), (1, "C1")):
                st = [e for e in self._of("step", node=node) if e["world"] == world]
                if st:
                    ax.plot([x(e["t"]) for e in st], [e["step"] for e in st],
                            marker, color=colour, ms=4 if node == "A" else 7, mfc="none"
                            if node == "B" else colour,
                            label=f"node {node}, world size {world}" + (
                                " (steps with B: dots in its squares)" if (node, world) == ("A", 2)
                                else ""))
        for e in self._of("checkpoint", node="A"):
            ax.axhline(e["step"], color="grey", lw=0.5, ls=":")
        ax.axvline(0, color="red", lw=1)
        top = self.config["steps"]
        # the label sits low, right of the line: clear of the legend and the bands' text
        ax.text(0.1, 1, "node B killed", color="red", fontsize=8, ha="left", va="center")
        mid = 0.5 * (1 + top)
        steps = self._of("step", node="A")
        if steps:  # before group 0's first step: its workers import, group and shard
            lo, hi = x(self.t0), x(min(e["t"] for e in steps))
            ax.axvspan(lo, hi, color="0.95", zorder=0)
            ax.text((lo + hi) / 2, mid, "group 0 starts:\nimports, process\ngroup, sharding",
                    ha="center", va="center", fontsize=8, color="0.3")
        f, cfg = self.failure(), self.config
        if None not in (f["spawned_s"], f["regrouped_s"], f["resumed_s"]):
            waits = (f"(B's heartbeats expire\n≤ "
                     f"{cfg['keep_alive_s'] * cfg['keep_alive_attempts']} s after the kill,\n"
                     f"then the last call, {cfg['last_call_s']} s)")
            for lo, hi, colour, text in (
                    (0.0, f["spawned_s"], "0.82", f"detect, agent, rendezvous\n{waits}"),
                    (f["spawned_s"], f["regrouped_s"], "0.89", "new Python\n+ torch"),
                    (f["regrouped_s"], f["resumed_s"], "0.95", "worker code:\nimports, load")):
                ax.axvspan(lo, hi, color=colour, zorder=0)
                ax.text((lo + hi) / 2, mid, text, ha="center", va="center", fontsize=8,
                        color="0.3", rotation=0 if lo == 0 else 90)  # the rendezvous' is wide
        ax.set_xlabel("seconds after node B was killed")
        ax.set_ylabel("step completed")
        ax.set_title("torchrun --nnodes 1:2: two agents, one dies (checkpoints dotted)")
        ax.legend(fontsize=8, loc="upper left")
        return ax


def elastic_job(**options) -> ElasticRun:
    """Run the two-agent elastic job (options override DEFAULTS; see the module doc).

    kill_step: the step at which node B dies (while the world size is 2); interval:
    a DCP checkpoint every so many steps; last_call_s, keep_alive_s, keep_alive_attempts:
    the c10d rendezvous' `last_call_timeout`, `keep_alive_interval` and
    `keep_alive_max_attempt` (shortened from torch's defaults so the demo takes seconds).
    """
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; choose from {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **options}
    for name in ("steps", "interval", "batch", "width", "features", "last_call_s",
                 "keep_alive_s", "keep_alive_attempts", "max_restarts"):
        if isinstance(cfg[name], bool) or not isinstance(cfg[name], int) or cfg[name] < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {cfg[name]!r}")
    if cfg["batch"] % 2:
        raise ValueError(f"batch must be even (split over 2 and then 1 ranks), got "
                         f"{cfg['batch']}")
    if not cfg["interval"] <= cfg["kill_step"] < cfg["steps"]:
        raise ValueError(f"kill_step must be in {cfg['interval']}..{cfg['steps'] - 1} (after "
                         f"the first checkpoint, before the end), got {cfg['kill_step']}")
    work = scratch_dir("elastic")
    procs: dict = {}
    logs = []
    config_path = os.path.join(work, "job.json")
    try:
        cfg["dir"] = work
        Path(config_path).write_text(json.dumps(cfg))
        port = _free_port()
        conf = (f"last_call_timeout={cfg['last_call_s']},keep_alive_interval="
                f"{cfg['keep_alive_s']},keep_alive_max_attempt={cfg['keep_alive_attempts']},"
                f"join_timeout={int(cfg['timeout_s'])}")
        base = {**os.environ, JOB_ENV: config_path, "GLOO_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        t0 = time.monotonic()
        for node in ("A", "B"):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2",
                   "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   f"127.0.0.1:{port}", "--rdzv-id", f"elastic{port}", "--local-addr",
                   "127.0.0.1", "--rdzv-conf", f"is_host={int(node == 'A')},{conf}",
                   "--max-restarts", str(cfg["max_restarts"]), "--monitor-interval", "0.1",
                   # Without --log-dir each agent makes /tmp/torchelastic_* and leaves it.
                   "--log-dir", os.path.join(work, f"agent-logs-{node}"),
                   "-m", "clusterlab.experiments.elastic"]
            log = open(os.path.join(work, f"agent-{node}.log"), "w")  # noqa: SIM115
            logs.append(log)
            procs[node] = subprocess.Popen(cmd, env={**base, NODE_ENV: node}, cwd=work,
                                           stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        try:
            procs["A"].wait(timeout=cfg["timeout_s"])
        except subprocess.TimeoutExpired:
            tail = Path(work, "agent-A.log").read_text(errors="replace").splitlines()[-3:]
            raise TimeoutError(f"the elastic job did not finish within {cfg['timeout_s']} s "
                               "(killed with its workers): " + " | ".join(tail)) from None
        with contextlib.suppress(subprocess.TimeoutExpired):
            procs["B"].wait(timeout=10)
        wall = time.monotonic() - t0
        time.sleep(0.2)  # let a dying worker's exit be reaped before we look
        leftover = job_processes(config_path)
        events = []
        for f in sorted(Path(work).glob("events-*.jsonl")):
            events += [json.loads(line) for line in f.read_text().splitlines() if line]
        codes = {n: p.returncode for n, p in procs.items()}
        if codes["A"] != 0 or not any(e["kind"] == "done" for e in events):
            tail = Path(work, "agent-A.log").read_text(errors="replace").splitlines()[-3:]
            raise RuntimeError(f"the elastic job failed (agent A exit {codes['A']}): "
                               + " | ".join(tail))
        import torch

        run = ElasticRun(config=cfg, returncodes=codes, wall_s=wall, events=events,
                         leftover=leftover)
        # checkpoint step -> what it saved; worker pid -> what that worker loaded
        for name, saved, resumed in (("params", run.saved, run.resumed),
                                     ("moments", run.saved_moments, run.resumed_moments)):
            for p in Path(work).glob(f"ckpt-*/{name}.pt"):
                saved[int(p.parent.name.split("-")[1])] = torch.load(p)
            for p in Path(work).glob(f"resume-{name}-*.pt"):
                resumed[int(p.stem.rsplit("-", 1)[1])] = torch.load(p)
        # what each checkpoint holds, read back from its DCP metadata before `work` goes
        from torch.distributed.checkpoint import FileSystemReader

        for meta in Path(work).glob("ckpt-*/.metadata"):
            run.saved_keys[int(meta.parent.name.split("-")[1])] = sorted(
                FileSystemReader(meta.parent).read_metadata().state_dict_metadata)
        run.final = torch.load(Path(work, "final.pt"))
        run.reference = reference_params(cfg)
        return run
    finally:
        _kill_all(procs, config_path)
        for log in logs:
            log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    _worker()
