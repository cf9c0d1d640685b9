"""The lab machinery: labs, their exercises, and the checks that grade a learner's code.

A lab file (e.g. `clusterlab/labs/ring.py`) registers itself:

    LAB = Lab("02_ring_allreduce", "Ring all-reduce from point-to-point",
              follows="02_allreduce_and_topology")
    RING = LAB.exercise("ring_allreduce", needs=("ring_allreduce",),
                        title="Ring all-reduce: reduce-scatter, then all-gather",
                        hints=("Split the tensor into p chunks ...", ...))

    @RING.check("sum on 2, 3 and 4 ranks", points=2)
    def _sum(ctx):
        fn = ctx.learner("ring_allreduce")
        out = ctx.run(ctx.cluster(nodes=3, nic=None), _on_rank, fn)
        if ...:
            raise Fail("rank 2 returned the sum of chunks 0-2 only: the all-gather is missing")
        return "every rank holds the exact sum"         # optional detail for a pass

A check passes by returning (a short detail string or None) and fails by raising `Fail`
with a sentence the learner can act on. `ctx.run` and `ctx.call` turn everything else a
learner's code can do into such a sentence: NotImplementedError becomes "not implemented
yet", a deadlock becomes a timeout that names the ranks and the operation each was in, an
exception names the rank and the line of the learner's code.

Hidden checks (`hidden=True`) run only when graded (`clusterlab grade`, nbgrader's
autograde, or CLUSTERLAB_LAB_HIDDEN=1); they draw their sizes, world sizes and networks
from `ctx.rng`, whose seed the grader chooses, so they cannot be answered by hard-coding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import time
import traceback
import weakref
from collections.abc import Callable

import numpy as np

from ..cluster import Cluster, ClusterTimeout, RankDied, RankError

# Environment variables a learner (at home), nbval and nbgrader set for a notebook's kernel.
# `clusterlab grade` sets none of the first three: it runs the checks itself, outside the
# kernel, with a seed the kernel never sees (see grade.py); it sets ENV_GRADING only.
ENV_HIDDEN = "CLUSTERLAB_LAB_HIDDEN"  # "1": run the hidden checks too
ENV_SEED = "CLUSTERLAB_LAB_SEED"  # seed of the hidden checks' draws (at home)
ENV_STRICT = "CLUSTERLAB_LAB_STRICT"  # "1": a failed check raises (nbval on solutions/)
ENV_GRADING = "CLUSTERLAB_LAB_GRADING"  # "1": check() only says the grader will run it
DEFAULT_SEED = 2026
CHECK_TIMEOUT = 15.0  # seconds a cluster run inside a check may take: deadlocks fail fast

NOT_DONE = "not implemented yet"


class Fail(AssertionError):
    """A check failed; the message is what the learner reads."""


class NotDone(Exception):
    """The learner's code still raises NotImplementedError."""


class LabCheckFailed(AssertionError):
    """Raised by `check()` in strict mode (nbval, nbgrader) when a check did not pass."""


@dataclasses.dataclass(frozen=True)
class Unavailable:
    """Stands in the grader's namespace for a learner's object that could not be carried out
    of the kernel (it could not be pickled, or not unpickled): its checks fail saying why."""
    reason: str


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    points: int
    hidden: bool
    fn: Callable


@dataclasses.dataclass
class Exercise:
    id: str
    lab: str
    title: str
    needs: tuple[str, ...]
    hints: tuple[str, ...]
    checks: list[Check] = dataclasses.field(default_factory=list)

    def check(self, name: str, *, points: int = 1, hidden: bool = False) -> Callable:
        """Decorator: register fn(ctx) as one of this exercise's checks."""
        if any(c.name == name for c in self.checks):
            raise ValueError(f"exercise {self.id!r} already has a check named {name!r}")
        if not isinstance(points, int) or points < 0:
            raise ValueError(f"points must be a non-negative integer, got {points!r}")

        def register(fn: Callable) -> Callable:
            self.checks.append(Check(name, points, hidden, fn))
            return fn

        return register

    @property
    def points(self) -> int:
        return sum(c.points for c in self.checks)


@dataclasses.dataclass
class Lab:
    id: str
    title: str
    follows: str  # the notebook (stem) this lab comes after
    exercises: list[Exercise] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.id in LABS:
            raise ValueError(f"lab {self.id!r} is registered twice")
        LABS[self.id] = self

    def exercise(self, id: str, *, needs: tuple[str, ...] = (), title: str = "",
                 hints: tuple[str, ...] = ()) -> Exercise:
        if id in EXERCISES:
            raise ValueError(f"exercise {id!r} exists already (in lab {EXERCISES[id].lab})")
        ex = Exercise(id, self.id, title or id, tuple(needs), tuple(hints))
        EXERCISES[id] = ex
        self.exercises.append(ex)
        return ex

    @property
    def checks(self) -> list[tuple[Exercise, Check]]:
        return [(ex, c) for ex in self.exercises for c in ex.checks]

    @property
    def points(self) -> int:
        return sum(ex.points for ex in self.exercises)


LABS: dict[str, Lab] = {}
EXERCISES: dict[str, Exercise] = {}


# --- what a check can use ----------------------------------------------------------------------


class Context:
    """What a check sees: the learner's namespace, a seeded RNG, and safe ways to run code."""

    def __init__(self, namespace: dict, *, seed: int, hidden: bool,
                 grader_seed: int | None = None) -> None:
        # seed: this check's own (differs per check); grader_seed: the one the grader chose,
        # shared by every check of a run (for draws several checks must agree on)
        self.namespace, self.seed, self.hidden = namespace, seed, hidden
        self.grader_seed = seed if grader_seed is None else grader_seed
        self.rng = np.random.default_rng(seed)

    def learner(self, name: str):
        """The learner's object called `name` (a function, a class, an answer)."""
        if name not in self.namespace:  # its TODO cell is unwritten, or was not run
            raise NotDone(f"`{name}` is not defined yet: write it in its TODO cell and run "
                          "that cell")
        value = self.namespace[name]
        if isinstance(value, Unavailable):
            raise Fail(f"`{name}` could not be handed to the grader ({value.reason}): "
                       "define it from plain values, functions and classes, not from open "
                       "clusters, files or threads")
        return value

    def cluster(self, *, timeout: float = CHECK_TIMEOUT, **kwargs) -> Cluster:
        """A Cluster with a short timeout (a deadlocked exercise fails in seconds).
        Use it as a context manager."""
        kwargs.setdefault("nic", None)
        return Cluster(timeout=timeout, **kwargs)

    def run(self, cl: Cluster, fn: Callable, *args, **kwargs) -> list:
        """cl.run(fn, ...) with every failure of the learner's code turned into Fail/NotDone."""
        try:
            return cl.run(fn, *args, **kwargs)
        except RankError as exc:
            if exc.kind == "NotImplementedError":
                raise NotDone(exc.message) from None
            if exc.kind in ("Fail", "AssertionError") and exc.message:
                raise Fail(f"rank {exc.rank}: {exc.message}") from None
            where = learner_line(exc.remote_traceback)
            raise Fail(f"rank {exc.rank} raised {exc.kind}: {shorten(exc.message)}"
                       f"{where}") from None
        except ClusterTimeout as exc:
            raise Fail(_timeout_sentence(str(exc), cl.timeout)) from None
        except RankDied as exc:
            raise Fail(f"{exc}. A rank dies like this when native code aborts (e.g. Gloo, on a "
                       "receive buffer whose size or dtype does not match the message sent), "
                       "on os._exit, or when it runs out of memory") from None

    def call(self, fn: Callable, *args, **kwargs):
        """fn(*args, **kwargs) in this process, with the learner's failures turned into Fail."""
        try:
            return fn(*args, **kwargs)
        except NotImplementedError as exc:
            raise NotDone(str(exc)) from None
        except (Fail, NotDone):
            raise
        except Exception as exc:  # noqa: BLE001 - the learner's code: any error is a message
            where = learner_line(traceback.format_exc())
            raise Fail(f"{getattr(fn, '__name__', 'your code')} raised "
                       f"{type(exc).__name__}: {shorten(str(exc))}{where}") from None


# Learner functions already found wrong (or deadlocked) in this kernel, with the message:
# later checks can say so at once instead of waiting for the same timeout again. Weak keys:
# an edited cell defines a new function, which is judged afresh.
_FAILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def remember_failure(fn, message: str) -> None:
    with contextlib.suppress(TypeError):  # not weak-referenceable: nothing to remember
        _FAILED[fn] = message


def earlier_failure(fn) -> str | None:
    """The message of fn's earlier failure in this kernel, if any."""
    try:
        return _FAILED.get(fn)
    except TypeError:
        return None


def shorten(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_CELL_FRAME = re.compile(r'File "(<ipython-input-[^"]+>|/tmp/ipykernel_[^"]+|<cell[^"]*>|'
                         r'<string>)", line (\d+), in (\S+)\n\s*(.*)')


def learner_line(tb: str) -> str:
    """' (in ring_allreduce: `dist.send(x, right)`)' for the innermost notebook-cell frame."""
    frames = _CELL_FRAME.findall(tb)
    if not frames:
        return ""
    _, _, func, source = frames[-1]
    return f" (in {func}: `{source.strip()}`)" if source.strip() else f" (in {func})"


_STACK_FRAME = re.compile(r'^\s*File "(.+)", line (\d+) in (\S+)\n\s{4}(.+)$', flags=re.M)
_ENGINE = (os.sep + "torch" + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)


def _timeout_sentence(message: str, seconds: float) -> str:
    """A ClusterTimeout rephrased: for each stuck rank, the operation it waits in (from the
    backend's status, else the innermost torch frame) and the learner's line that called it."""
    status = dict(re.findall(r"^\s+rank (\d+): in (.+)$", message, flags=re.M))
    stacks = dict(re.findall(r"^--- rank (\d+) ---\n((?:(?!--- rank).*\n?)*)", message,
                             flags=re.M))
    parts = []
    for rank in sorted(status, key=int):
        frames = _STACK_FRAME.findall(stacks.get(rank, ""))  # innermost first
        op = status[rank]
        if op.startswith("running") and frames and _ENGINE[0] in frames[0][0]:
            op = frames[0][2]  # plain Gloo has no status: name the torch call instead
        mine = next((f for f in frames if not any(e in f[0] for e in _ENGINE)), None)
        where = f" at `{mine[3].split('  # ')[0].strip()}` (in {mine[2]})" if mine else ""
        parts.append(f"rank {rank} in {op}{where}")
    what = "; ".join(parts) or "unknown ranks"
    return (f"timed out after {seconds:g} s - a deadlock or a missing send/recv? "
            f"Still waiting: {what}. Every send needs a matching recv on the peer, "
            f"and blocking sends and recvs must not wait on each other in a cycle.")


# --- running an exercise's checks ---------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    exercise: str
    check: str
    points: int
    hidden: bool
    status: str  # "pass", "fail", "todo" (not implemented), "skip" (hidden, not run)
    message: str
    seconds: float

    @property
    def earned(self) -> int:
        return self.points if self.status == "pass" else 0


@dataclasses.dataclass
class Report:
    exercise: Exercise
    outcomes: list[Outcome]

    @property
    def passed(self) -> bool:
        return all(o.status == "pass" for o in self.outcomes if o.status != "skip")

    @property
    def earned(self) -> int:
        return sum(o.earned for o in self.outcomes)

    @property
    def possible(self) -> int:
        return sum(o.points for o in self.outcomes if o.status != "skip")

    def text(self) -> str:
        ex = self.exercise
        lines = [f"{ex.id}: {ex.title} - {self.earned}/{self.possible} points"]
        mark = {"pass": "PASS", "fail": "FAIL", "todo": "TODO"}
        skipped = 0
        for o in self.outcomes:
            if o.status == "skip":
                skipped += 1
                continue
            tag = " (hidden)" if o.hidden else ""
            lines.append(f"  {mark[o.status]}  {o.check}{tag} [{o.points} pt, {o.seconds:.1f} s]")
            if o.message:
                lines.append(f"        {o.message}")
        if skipped:
            lines.append(f"  + {skipped} hidden check(s) that run when the lab is graded "
                         "(other sizes, world sizes, seeds and networks)")
        if any(o.status == "fail" for o in self.outcomes) and ex.hints:
            lines.append(f'  Stuck? hint("{ex.id}") gives a hint; call it again for the next.')
        return "\n".join(lines)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0", "false", "no")


def run_checks(exercise: str, namespace: dict, *, hidden: bool | None = None,
               seed: int | None = None, only: str | None = None) -> Report:
    """Run an exercise's checks against the learner's objects in `namespace` (or just the
    check named `only`: tests of one wrong answer need not pay for the others)."""
    if exercise not in EXERCISES:
        known = ", ".join(sorted(EXERCISES))
        raise ValueError(f"no exercise called {exercise!r}; the exercises are: {known}")
    ex = EXERCISES[exercise]
    if only is not None and only not in (c.name for c in ex.checks):
        names = "; ".join(c.name for c in ex.checks)
        raise ValueError(f"{exercise} has no check {only!r}; its checks: {names}")
    if hidden is None:  # nbgrader's autograder grades with the hidden checks too
        hidden = _env_flag(ENV_HIDDEN) or os.environ.get("NBGRADER_EXECUTION") == "autograde"
    if seed is None:
        seed = int(os.environ.get(ENV_SEED, DEFAULT_SEED))
    outcomes: list[Outcome] = []
    todo = ""
    for i, c in enumerate(ex.checks):
        if only is not None and c.name != only:
            continue
        if c.hidden and not hidden:
            outcomes.append(Outcome(ex.id, c.name, c.points, True, "skip", "", 0.0))
            continue
        if todo:  # the first check found the TODO still there: the rest would say the same
            outcomes.append(Outcome(ex.id, c.name, c.points, c.hidden, "todo", todo, 0.0))
            continue
        ctx = Context(namespace, seed=seed * 1000 + i, hidden=hidden, grader_seed=seed)
        t0 = time.perf_counter()
        try:
            detail = c.fn(ctx)
            status, message = "pass", detail or ""
        except NotDone as exc:
            todo = f"{NOT_DONE} ({shorten(str(exc))})" if str(exc) else NOT_DONE
            todo += ": replace the `raise NotImplementedError` in its TODO cell with your code"
            status, message = "todo", todo
        except Fail as exc:
            status, message = "fail", str(exc)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a check never ends in a bare traceback
            where = learner_line(traceback.format_exc())
            status, message = "fail", f"{type(exc).__name__}: {shorten(str(exc))}{where}"
        outcomes.append(Outcome(ex.id, c.name, c.points, c.hidden, status, message,
                                time.perf_counter() - t0))
    return Report(ex, outcomes)


def check(exercise: str, **given) -> None:
    """Run an exercise's checks on your code and print what passed, what failed and why.

    Your functions are found by name in the notebook (the names the exercise asks for);
    pass them explicitly to check something else: check("ring_allreduce", ring_allreduce=f).
    """
    if _env_flag(ENV_GRADING):  # `clusterlab grade` runs the checks itself, after the notebook
        print(f"{exercise}: the grader runs this exercise's checks after the notebook")
        return
    caller = sys._getframe(1).f_globals
    report = run_checks(exercise, {**caller, **given})
    print(report.text())
    strict = _env_flag(ENV_STRICT) or bool(os.environ.get("NBGRADER_EXECUTION"))
    if strict and not report.passed:
        raise LabCheckFailed(f"{exercise}: {report.earned}/{report.possible} points")


_hints_given: dict[str, int] = {}


def hint(exercise: str) -> None:
    """Print the next hint for an exercise (each call reveals one more)."""
    if exercise not in EXERCISES:
        raise ValueError(f"no exercise called {exercise!r}")
    hints = EXERCISES[exercise].hints
    if not hints:
        print(f"{exercise}: no hints for this one - read its markdown cell again.")
        return
    n = min(_hints_given.get(exercise, 0), len(hints) - 1)
    _hints_given[exercise] = n + 1
    more = "" if n + 1 == len(hints) else " (call again for the next)"
    print(f"hint {n + 1}/{len(hints)} for {exercise}{more}:\n  {hints[n]}")


@contextlib.contextmanager
def temp_env(**values: str | None):
    """Set (None: unset) environment variables for a block; the grader's kernels inherit them."""
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
