"""Failures and elasticity: a rank dies, a peer hangs, a checkpoint stalls, and goodput.

* `torchrun_job` - a real `torchrun --standalone --max-restarts K` job (the c10d rendezvous
  on this machine, the "netem" backend selected by its CLUSTERLAB_* environment). Its
  workers train in steps (a compute sleep standing for the accelerator, then a real
  all-reduce through the emulated network), rank 0 checkpoints every `interval` steps, and a
  rank SIGKILLs itself at the steps the failure schedule names. torchrun's agent sees the
  death, stops the other workers and restarts the group; the new workers load the last
  checkpoint and redo the steps since. Every worker logs timestamped events (the shared
  CLOCK_MONOTONIC), from which `JobRun` measures the restart time, the redone work and the
  goodput.
* `hung_peer` - a rank that never enters a collective: how long the others wait (the
  group's timeout; torch's default is `default_timeout()`), and `monitored_barrier`, which
  names the missing rank.
* `checkpoint_stalls` - synchronous vs asynchronous checkpoint saves in step-time traces.

Temporary files live in `clusterlab-<pid>-failures-*` directories in the temp dir (the
launcher's naming, so a later start sweeps what a killed parent left) and are removed at the
end; a torchrun job runs in its own session and is killed whole if it overruns.

The closed forms (Young/Daly interval, expected waste) are `clusterlab.models`'.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np

from .. import models
from ..cluster import Cluster
from .common import marked_processes

JOB_ENV = "CLUSTERLAB_FAILURE_JOB"  # the job's config file; also marks its processes
JOB_DEFAULTS = dict(nodes=2, steps=24, interval=4, compute_s=0.05, failures=(), kill_rank=1,
                    state_mb=8.0, grad_floats=65536, nic="delay 1ms rate 1gbit",
                    max_restarts=3, timeout_s=60.0, collective_timeout_s=20.0)


def default_timeout() -> timedelta:
    """torch.distributed's default timeout for a Gloo process group (what a job that sets
    none waits for a peer that never comes)."""
    from torch.distributed import constants

    return constants.default_pg_timeout


# --- the torchrun worker ----------------------------------------------------------------------


def _job_main() -> None:
    """One torchrun worker (run as `python -m clusterlab.experiments.failures`)."""
    path = Path(os.environ[JOB_ENV])
    cfg = json.loads(path.read_text())
    import torch
    import torch.distributed as dist

    import clusterlab  # noqa: F401 - registers the "netem" backend

    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    work = path.parent
    with open(work / f"events-{rank}.jsonl", "a", buffering=1) as log:

        def event(kind: str, **data) -> None:
            log.write(json.dumps({"kind": kind, "t": time.monotonic_ns(), "rank": rank,
                                  "attempt": attempt, **data}) + "\n")

        event("process")  # Python and torch are loaded
        stacks = open(work / f"stacks-{rank}-{attempt}.txt", "w")  # noqa: SIM115
        faulthandler.dump_traceback_later(cfg["collective_timeout_s"] / 2, file=stacks)
        dist.init_process_group("netem",
                                timeout=timedelta(seconds=cfg["collective_timeout_s"]))
        checkpoint = work / "checkpoint.pt"
        state = torch.zeros(int(cfg["state_mb"] * 2**20 / 4))
        step = 0
        if checkpoint.exists():
            saved = torch.load(checkpoint)
            state, step = saved["state"], saved["step"]
        event("resume", step=step)
        faulthandler.cancel_dump_traceback_later()
        try:
            _train(cfg, event, state, step, attempt, rank, checkpoint)
        except Exception as exc:
            event("error", error=_one_line(str(exc)))
            raise
        dist.destroy_process_group()


def _train(cfg: dict, event, state, step: int, attempt: int, rank: int, checkpoint) -> None:
    """The training loop of one attempt, from `step` (the checkpoint's) to the end."""
    import torch
    import torch.distributed as dist

    failures = cfg["failures"]
    grad = torch.empty(cfg["grad_floats"])
    while step < cfg["steps"]:
        if attempt < len(failures) and step == failures[attempt] and rank == cfg["kill_rank"]:
            event("kill", step=step)  # the log is line-buffered: this line is on disk
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(cfg["compute_s"])  # the accelerator's forward and backward
        grad.fill_(1.0)
        dist.all_reduce(grad)
        state[: grad.numel()] += 1e-3 * grad
        step += 1
        event("step", step=step)
        if step % cfg["interval"] == 0 and step < cfg["steps"] and rank == 0:
            t0 = time.monotonic_ns()
            save(checkpoint, {"state": state, "step": step})
            event("checkpoint", step=step, seconds=(time.monotonic_ns() - t0) / 1e9)
    event("done", step=step)


def save(path: Path, blob: dict) -> None:
    """A durable checkpoint: write a temporary file, fsync it, rename it over the old one (a
    crash mid-save leaves the previous checkpoint intact), then fsync the directory so that
    the rename itself survives a power loss."""
    import torch

    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        torch.save(blob, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the parent: start a job, read its events ---------------------------------------------------


def scratch_dir(kind: str) -> str:
    """A private temp dir named as the launcher names its own (swept if we die)."""
    return tempfile.mkdtemp(prefix=f"clusterlab-{os.getpid()}-{kind}-")


def job_processes(config_path: str) -> list[int]:
    """Live processes that carry this job's config in their environment (its workers)."""
    return marked_processes(JOB_ENV, config_path)


@dataclass
class JobRun:
    """A finished torchrun job: its configuration, exit code, wall time and events."""

    config: dict
    returncode: int
    wall_s: float  # from starting torchrun to its exit
    events: list[dict]
    leftover: list[int]  # processes of the job still alive after it ended (none expected)

    def _of(self, kind: str, **match) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind
                and all(e.get(k) == v for k, v in match.items())]

    @property
    def attempts(self) -> int:
        return 1 + max(e["attempt"] for e in self.events)

    @property
    def first_s(self) -> float:
        return min(e["t"] for e in self.events) / 1e9

    def step_seconds(self) -> np.ndarray:
        """Failure-free step times: between consecutive steps of one attempt on rank 0,
        leaving out steps that followed a checkpoint (their stall is `checkpoint_s`)."""
        out = []
        ckpt_steps = {e["step"] for e in self._of("checkpoint")}
        for a in range(self.attempts):
            steps = self._of("step", rank=0, attempt=a)
            for prev, cur in zip(steps, steps[1:], strict=False):
                if prev["step"] not in ckpt_steps:
                    out.append((cur["t"] - prev["t"]) / 1e9)
        return np.array(out)

    @property
    def step_s(self) -> float:
        return float(np.median(self.step_seconds()))

    @property
    def checkpoint_s(self) -> float:
        """Median time rank 0 spent saving one checkpoint."""
        return float(np.median([e["seconds"] for e in self._of("checkpoint")]))

    @property
    def checkpoints(self) -> int:
        return len(self._of("checkpoint"))

    def failures(self) -> list[dict]:
        """Per failure: the step it hit, the checkpoint the group resumed from, and

        restart_s - from the SIGKILL to the last rank of the new group having loaded the
          checkpoint, in two parts: respawn_s, until the last new worker has Python and
          torch loaded (the agent noticing, stopping the others, its rendezvous round, which
          torchrun runs before it spawns workers, and the new interpreters' start), and
          rejoin_s, the worker's init_process_group against the agent's store and the
          checkpoint's load;
        redo_s - from there until the group was back at the step where it died;
        lost_s - their sum: the wall time this failure cost.
        """
        rows = []
        for kill in self._of("kill"):
            after = kill["attempt"] + 1
            resumes = self._of("resume", attempt=after)
            if not resumes:
                continue
            resumed_at = max(e["t"] for e in resumes)
            spawned_at = max(e["t"] for e in self._of("process", attempt=after))
            back = [e["t"] for e in self._of("step", attempt=after, step=kill["step"])]
            back_t = max(back) if back else resumed_at  # died right after a checkpoint
            rows.append({"step": kill["step"], "resumed_from": resumes[0]["step"],
                         "redone_steps": kill["step"] - resumes[0]["step"],
                         "restart_s": (resumed_at - kill["t"]) / 1e9,
                         "respawn_s": (spawned_at - kill["t"]) / 1e9,
                         "rejoin_s": (resumed_at - spawned_at) / 1e9,
                         "redo_s": (back_t - resumed_at) / 1e9,
                         "lost_s": (back_t - kill["t"]) / 1e9})
        return rows

    @property
    def train_s(self) -> float:
        """From the first worker's start to the last worker's end."""
        return (max(e["t"] for e in self._of("done")) - min(e["t"] for e in self.events)) / 1e9

    @property
    def startup_s(self) -> float:
        """From the first worker's start to the first group's resume (rendezvous, init)."""
        first = [e["t"] for e in self._of("resume", attempt=0)]
        return (max(first) - min(e["t"] for e in self.events)) / 1e9

    def goodput(self) -> float:
        """Useful steps per second of the training (first worker start to the end)."""
        return self.config["steps"] / self.train_s

    def plot_timeline(self, ax=None, title: str | None = None):
        """Each rank's completed steps over time, one colour per attempt; kills marked."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 3))
        t0 = self.first_s
        for a in range(self.attempts):
            for rank in range(self.config["nodes"]):
                st = self._of("step", rank=rank, attempt=a)
                ax.plot([e["t"] / 1e9 - t0 for e in st], [e["step"] for e in st],
                        ".-" if rank == 0 else ".", color=f"C{a}", ms=3,
                        label=f"attempt {a}" if rank == 0 else None)
        for e in self._of("checkpoint"):
            ax.axhline(e["step"], color="grey", lw=0.5, ls=":")
        for e in self._of("kill"):
            ax.axvline(e["t"] / 1e9 - t0, color="red", lw=1)
            ax.annotate(f"rank {e['rank']} SIGKILL", (e["t"] / 1e9 - t0, e["step"]),
                        color="red", fontsize=8, xytext=(4, 4), textcoords="offset points")
        ax.set_xlabel("seconds since the first worker's first event (after its torch import)")
        ax.set_ylabel("step completed")
        ax.set_title(title or f"torchrun, {self.config['nodes']} workers, checkpoint every "
                     f"{self.config['interval']} steps (dotted)")
        ax.legend(fontsize=8)
        return ax

    def summary(self) -> dict:
        fails = self.failures()
        return {"steps": self.config["steps"], "interval": self.config["interval"],
                "failures": len(fails), "attempts": self.attempts,
                "returncode": self.returncode, "step_s": self.step_s,
                "checkpoint_s": self.checkpoint_s if self.checkpoints else 0.0,
                "checkpoints": self.checkpoints, "startup_s": self.startup_s,
                "restart_s": float(np.mean([f["restart_s"] for f in fails])) if fails else 0.0,
                "train_s": self.train_s, "wall_s": self.wall_s,
                "goodput_steps_per_s": self.goodput(),
                "goodput_fraction": self.config["steps"] * self.step_s / self.train_s,
                "leftover_processes": len(self.leftover)}


def torchrun_job(**options) -> JobRun:
    """Run one torchrun job (options override JOB_DEFAULTS; see the module doc).

    failures: the steps at which `kill_rank` SIGKILLs itself, the i-th in the i-th attempt
    (so each is a new failure of the restarted group); interval: checkpoint every so many
    steps; state_mb: the checkpoint's size; compute_s: the accelerator's time per step.
    """
    unknown = set(options) - set(JOB_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; choose from "
                        f"{sorted(JOB_DEFAULTS)}")
    cfg = {**JOB_DEFAULTS, **options}
    cfg["failures"] = [int(s) for s in cfg["failures"]]
    for name in ("nodes", "steps", "interval"):
        if isinstance(cfg[name], bool) or not isinstance(cfg[name], int) or cfg[name] < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {cfg[name]!r}")
    if cfg["nodes"] < 2:
        raise ValueError(f"nodes must be >= 2 (a failure needs a peer), got {cfg['nodes']}")
    if not 0 <= cfg["kill_rank"] < cfg["nodes"]:
        raise ValueError(f"kill_rank must be in 0..{cfg['nodes'] - 1}, got {cfg['kill_rank']}")
    if cfg["failures"] != sorted(cfg["failures"]) or any(
            not 0 <= s < cfg["steps"] for s in cfg["failures"]):
        raise ValueError(f"failures must be increasing steps in 0..{cfg['steps'] - 1}, "
                         f"got {cfg['failures']}")
    if len(cfg["failures"]) > cfg["max_restarts"]:
        raise ValueError(f"{len(cfg['failures'])} failures need max_restarts >= that, "
                         f"got {cfg['max_restarts']}")
    work = scratch_dir("failures")
    try:
        config_path = os.path.join(work, "job.json")
        Path(config_path).write_text(json.dumps(cfg))
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers get their own store, not the
        # agent's. Shared (the default), restarts hung here in the new group's process group
        # creation about one time in three: a restarted group can read the previous
        # attempt's keys (pytorch/pytorch#135712). The fix, #135957 (relanded as #136768),
        # meant a new store server per restart, but torch 2.13's DynamicRendezvousHandler.
        # next_rendezvous creates the shared server only on the first round (or when rank 0
        # moves) and reuses it, while the workers add no per-attempt prefix on the
        # assumption of a new store per retry (torch/distributed/rendezvous.py,
        # _create_c10d_store).
        env = {**os.environ, JOB_ENV: config_path, "CLUSTERLAB_NIC": cfg["nic"],
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
               "TORCHELASTIC_ERROR_FILE": os.path.join(work, "error.json")}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(cfg["nodes"]), "--max-restarts",
               str(cfg["max_restarts"]), "--monitor-interval", "0.1",  # torch 2.13's default
               # Without --log-dir the agent makes /tmp/torchelastic_* and never removes it.
               "--log-dir", os.path.join(work, "agent-logs"),
               "-m", "clusterlab.experiments.failures"]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=cfg["timeout_s"])
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            raise TimeoutError(f"the torchrun job did not finish within {cfg['timeout_s']} s "
                               f"(killed with its workers){_stuck_in(work)}") from None
        finally:
            _kill_session(proc)
        wall = time.monotonic() - t0
        leftover = job_processes(config_path)
        events = []
        for f in sorted(Path(work).glob("events-*.jsonl")):
            events += [json.loads(line) for line in f.read_text().splitlines() if line]
        if proc.returncode != 0 or not any(e["kind"] == "done" for e in events):
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"the torchrun job failed (exit {proc.returncode}): "
                               + " | ".join(tail))
        return JobRun(config=cfg, returncode=proc.returncode, wall_s=wall, events=events,
                      leftover=leftover)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stuck_in(work: str) -> str:
    """Where the workers of the last attempt were stuck (their faulthandler dumps)."""
    dumps = [f for f in sorted(Path(work).glob("stacks-*.txt")) if f.stat().st_size]
    if not dumps:
        return ""
    frames = [line.strip() for line in dumps[-1].read_text().splitlines() if "File" in line]
    return f"; {dumps[-1].stem} was in: " + " <- ".join(frames[:3])


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun's session (the agent and every worker), then reap the agent."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def predicted_train_s(*, steps: int, interval: int, failures, step_s: float,
                      checkpoint_s: float, restart_s: float, startup_s: float = 0.0) -> float:
    """The wall time of a job with failures at known steps: startup, every step once, every
    checkpoint, and per failure a restart plus the steps since its last checkpoint."""
    checkpoints = (steps - 1) // interval
    redone = sum(s - (s // interval) * interval for s in failures)
    return (startup_s + steps * step_s + checkpoints * checkpoint_s
            + len(failures) * restart_s + redone * step_s)


def failure_schedule(*, steps: int, mtbf_steps: float, seed: int = 0, limit: int = 3) -> list:
    """Failure steps drawn as a Poisson process in useful-work time (exponential gaps of mean
    `mtbf_steps`), at most `limit`, strictly increasing, within the job."""
    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    while len(out) < limit:
        t += rng.exponential(mtbf_steps)
        s = int(t)
        if s >= steps:
            break
        if not out or s > out[-1]:
            out.append(s)
    return out


def expected_goodput(*, interval_s: float, checkpoint_s: float, mtbf_s: float,
                     restart_s: float) -> float:
    """1 - models.checkpoint_waste(...): the expected useful fraction of wall time."""
    return 1.0 - models.checkpoint_waste(interval_s, checkpoint_s, mtbf_s, restart_s)


# --- a hung peer --------------------------------------------------------------------------------


def _hung_worker(timeout_s: float, hang_rank: int, monitored: bool) -> dict:
    import torch
    import torch.distributed as dist

    group = dist.new_group(timeout=timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    out = {"rank": rank}
    try:
        if rank == hang_rank:  # stuck elsewhere (a deadlock, a dead GPU): never enters
            time.sleep(timeout_s + 0.3)
            return out
        t0 = time.monotonic()
        try:
            if monitored:
                group.monitored_barrier(timedelta(seconds=timeout_s))
            else:
                dist.all_reduce(torch.ones(4), group=group)
            out["error"] = None
        except RuntimeError as exc:
            out["error"] = _one_line(str(exc))
        out["waited_s"] = time.monotonic() - t0
        return out
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group(group)


def _one_line(message: str) -> str:
    from .common import _tidy

    lines = [line for line in message.splitlines() if line.strip()]
    return _tidy(lines[0]) if lines else ""


def hung_peer(timeouts_s=(0.5, 1.5), *, nodes: int = 3, hang_rank: int = 2,
              nic: str = "delay 1ms", kinds=("all_reduce", "monitored_barrier"),
              cluster: Cluster | None = None) -> list[dict]:
    """For each timeout and each of `kinds`: the other ranks all-reduce (or call
    `monitored_barrier`) while `hang_rank` never comes. Rows: timeout, kind, per waiting rank
    the seconds until the error and its message."""
    from .common import use_or_open

    if not kinds or set(kinds) - {"all_reduce", "monitored_barrier"}:
        raise ValueError(f"kinds must name all_reduce and/or monitored_barrier, got {kinds}")
    if not 0 <= hang_rank < nodes:
        raise ValueError(f"hang_rank must be in 0..{nodes - 1}, got {hang_rank}")
    if any(not t > 0 for t in timeouts_s):
        raise ValueError(f"timeouts_s must be positive seconds, got {timeouts_s}")
    rows = []
    with use_or_open(cluster, ranks=nodes, nodes=nodes, nic=nic,
                     timeout=max(timeouts_s) + 30) as cl:
        for t in timeouts_s:
            for monitored in [k == "monitored_barrier" for k in kinds]:
                res = [r for r in cl.run(_hung_worker, t, hang_rank, monitored)
                       if "waited_s" in r]
                rows.append({"timeout_s": t, "kind": "monitored_barrier" if monitored
                             else "all_reduce", "waited_s": [r["waited_s"] for r in res],
                             "errors": [r["error"] for r in res]})
    return rows


# --- checkpoint stalls ---------------------------------------------------------------------------


def _stall_worker(cfg: dict) -> dict:
    import threading

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    state = torch.randn(int(cfg["state_mb"] * 2**20 / 4), generator=torch.Generator()
                        .manual_seed(0))
    grad = torch.ones(cfg["grad_floats"])
    path = Path(cfg["dir"]) / f"checkpoint-{cfg['mode']}.pt"
    writer = None
    # async: one staging buffer, allocated (and its pages touched) once, reused by every save;
    # a fresh clone per save would time the kernel's page faults, not the copy
    staging = torch.zeros_like(state) if cfg["mode"] == "async" else None
    steps, saved, copy_s, write_s = [], [], [], []

    def write(snapshot):
        t0 = time.monotonic_ns()
        save(path, snapshot)
        write_s.append((time.monotonic_ns() - t0) / 1e9)

    for step in range(cfg["steps"]):
        t0 = time.monotonic_ns()
        time.sleep(cfg["compute_s"])
        dist.all_reduce(grad)
        state[: grad.numel()] += 1e-6
        if rank == 0 and cfg["mode"] != "none" and (step + 1) % cfg["interval"] == 0:
            if cfg["mode"] == "sync":
                write({"state": state, "step": step})
            else:  # async: copy in the step (the state keeps changing), write in a thread
                if writer is not None:
                    writer.join()  # one save in flight at a time
                c0 = time.monotonic_ns()
                snapshot = {"state": staging.copy_(state), "step": step}
                copy_s.append((time.monotonic_ns() - c0) / 1e9)
                writer = threading.Thread(target=write, args=(snapshot,))
                writer.start()
            saved.append(step)
        steps.append((time.monotonic_ns() - t0) / 1e9)
    if writer is not None:
        writer.join()
    return {"rank": rank, "step_s": steps, "saved": saved, "copy_s": copy_s,
            "write_s": write_s}


def checkpoint_stalls(*, nodes: int = 2, steps: int = 34, interval: int = 5,
                      state_mb: float = 32.0, compute_s: float = 0.04,
                      nic: str = "delay 1ms rate 1gbit", cluster: Cluster | None = None) -> dict:
    """Step-time traces with rank 0 checkpointing `state_mb` every `interval` steps, saved
    synchronously ("sync": the step waits for torch.save + fsync) or asynchronously
    ("async": the step copies the state, a thread writes it; what
    torch.distributed.checkpoint.async_save does, staging to memory first), and a control
    run without saves ("none": the same steps, nothing written) that measures what this
    machine does to the same statistic when no save happens.
    {mode: {"step_s": (ranks, steps) seconds, "saved": the steps that saved, "copy_s",
    "write_s": per save, rank 0's copy and write times}}."""
    from .common import use_or_open

    work = scratch_dir("checkpoint")
    out = {}
    try:
        with use_or_open(cluster, nodes=nodes, nic=nic, timeout=120) as cl:
            for mode in ("none", "sync", "async"):
                cfg = dict(mode=mode, steps=steps, interval=interval, state_mb=state_mb,
                           compute_s=compute_s, grad_floats=65536, dir=work)
                res = cl.run(_stall_worker, cfg)
                out[mode] = {"step_s": np.array([r["step_s"] for r in res]),
                             "saved": res[0]["saved"], "copy_s": res[0]["copy_s"],
                             "write_s": res[0]["write_s"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def stall_summary(traces: dict) -> dict:
    """Per mode, statistics that one machine-wide stall cannot drive (the median over saves).

    A save's window is its step and the steps up to the next save (rank 0's steps; the ranks
    meet at every all-reduce, so a window's time is the job's). A save's cost to the job is
    its window's time minus the window's length x the median step of the run without saves
    ("none"); "lost_per_save_s" is the median over the saves (step 0, the warm-up, is in no
    window). "noise_s" is the same statistic on the run without saves, windows at the same
    steps (median over windows) and "noise_max_s" its largest absolute value: what this
    machine adds to a window when nothing is saved. "blocked_s": the median excess of rank 0's
    save step alone (the part of a save the step waits for); "after_s": the median of rank 1's
    step right after a save ("after_n" of them) against its median step "rank1_step_s";
    rank 0's median write and copy per save, "write_s" and "copy_s"."""
    control = np.asarray(traces["none"]["step_s"]) if "none" in traces else None
    saved = next(tr["saved"] for mode, tr in traces.items() if mode != "none")
    steps = np.asarray(next(iter(traces.values()))["step_s"]).shape[1]
    interval = saved[1] - saved[0] if len(saved) > 1 else steps - saved[0]
    windows = [(k, min(k + interval, steps)) for k in saved]
    base = float(np.median((control if control is not None
                            else np.asarray(traces["sync"]["step_s"]))[0, 1:]))

    def excess(row, a, b):
        return float(row[a:b].sum() - (b - a) * base)

    noise = [excess(control[0], a, b) for a, b in windows] if control is not None else [0.0]
    out = {}
    for mode, tr in traces.items():
        if mode == "none":
            continue
        s = np.asarray(tr["step_s"])
        lost = [excess(s[0], a, b) for a, b in windows]
        after = [float(s[1][k + 1]) for k in tr["saved"] if k + 1 < steps]
        out[mode] = {"step_s": base, "lost_per_save_s": float(np.median(lost)),
                     "lost_s": lost, "saves": len(lost), "window_steps": interval,
                     "noise_s": float(np.median(noise)),
                     "noise_max_s": float(np.max(np.abs(noise))),
                     "blocked_s": float(np.median([s[0][k] - base for k in tr["saved"]])),
                     "after_s": float(np.median(after)) if after else float("nan"),
                     "after_n": len(after), "rank1_step_s": float(np.median(s[1][1:])),
                     "write_s": float(np.median(tr["write_s"])) if tr["write_s"] else 0.0,
                     "copy_s": float(np.median(tr["copy_s"])) if tr["copy_s"] else 0.0}
    return out


if __name__ == "__main__":
    _job_main()
