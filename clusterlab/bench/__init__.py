"""Benchmarks behind `clusterlab bench NAME -o PATH`.

Each bench returns {"bench", "machine", "rows", "checks"}: rows are raw enough to recompute
every check, and each check is {"name", "target", "measured", "ok"}. Figures are ratios or
are compared with what was configured in the same run, never with absolute expectations
about this (shared, noisy) machine's speed.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

BENCHES: dict[str, Callable[..., dict]] = {}
DETAILS: dict[str, Callable[[list[dict]], list[str]]] = {}  # extra markdown from a bench's rows


def bench(name: str):
    def register(fn):
        BENCHES[name] = fn
        return fn

    return register


def result(name: str, rows: list[dict], checks: list[dict]) -> dict:
    from ..doctor import machine

    return {"bench": name, "machine": machine(), "rows": rows, "checks": checks}


def check(name: str, target: str, measured, ok: bool) -> dict:
    return {"name": name, "target": target, "measured": measured, "ok": bool(ok)}


def _load() -> None:
    from . import (  # noqa: F401
        course,
        fabric,
        faults,
        fidelity,
        launch,
        model,
        monitor_overhead,
        overhead,
        shaping,
        soak,
        widgets,
    )


def details(name: str):
    """Register a function rendering more markdown from a bench's rows (for RESULTS.md)."""
    def register(fn):
        DETAILS[name] = fn
        return fn

    return register


PLAIN_EVERY_S = 10.0  # without a terminal (or tqdm): a progress line at most this often


class _Progress:
    """Rows done so far, on stderr: a tqdm counter on a terminal; elsewhere (a log, a pipe,
    no tqdm) a plain line now and then, since tqdm's redraws turn a log into noise."""

    def __init__(self, name: str):
        self.name, self.rows, self.t0, self.said = name, 0, time.monotonic(), None
        self.bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(desc=f"bench {name}", unit=" rows", file=sys.stderr)
        if self.bar is None:
            self._say("started")

    def _say(self, what: str) -> None:
        self.said = time.monotonic()
        print(f"bench {self.name}: {what} ({self.said - self.t0:.0f} s)", file=sys.stderr,
              flush=True)

    def step(self) -> None:
        self.rows += 1
        if self.bar is not None:
            self.bar.update(1)
        elif time.monotonic() - self.said >= PLAIN_EVERY_S:
            self._say(f"{self.rows} rows")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            self._say(f"done, {self.rows} rows")


_progress: _Progress | None = None


def tick() -> None:
    """A bench finished one row (or group of samples): progress for `clusterlab bench`. Does
    nothing when a bench is called directly (tests, notebooks); it never touches the figures."""
    if _progress is not None:
        _progress.step()


def run(name: str, path: str | None = None, quick: bool = False) -> dict:
    """Run bench `name`, write its JSON to `path` (if given), return it; progress on stderr
    while it runs."""
    global _progress
    _load()
    if name not in BENCHES:
        raise ValueError(f"unknown bench {name!r}; choose from {', '.join(sorted(BENCHES))}")
    _progress = _Progress(name)
    try:
        out = BENCHES[name](quick=quick)
    finally:
        _progress.close()
        _progress = None
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return out


def measured_text(measured) -> str:
    """A check's figure for a table: a repeated figure as its median and range."""
    if isinstance(measured, dict) and {"median", "min", "max"} <= measured.keys():
        return f"{measured['median']} ({measured['min']}..{measured['max']})"
    return str(measured)


def _machine_line(m: dict) -> str:
    when = (f" Measured {m['date']}" + (f" at commit {m['commit']}" if m.get("commit") else "")
            + "." if m.get("date") else " Measured before results recorded their date.")
    return (f"Machine: {m.get('cores')} cores, {m.get('memory_gb')} GB, python "
            f"{m.get('python')}, torch {m.get('torch')}.{when}")


def markdown(outs: list[dict]) -> str:
    """A RESULTS.md section per bench, generated from its JSON (figures are never typed in).

    Several results of one bench (runs repeated to show that a figure reproduces) share one
    section: a column per run, and whether each check was met in every run."""
    _load()
    groups: dict[str, list[dict]] = {}
    for out in outs:
        groups.setdefault(out["bench"], []).append(out)
    lines = []
    for name, runs in groups.items():
        first = runs[0]
        if len(runs) == 1:
            met = sum(c["ok"] for c in first["checks"])
            lines += [f"## {name}", "",
                      f"{_machine_line(first['machine'])} Checks met: {met}/"
                      f"{len(first['checks'])}.", "",
                      "| check | target | measured | met |", "| --- | --- | --- | --- |"]
            for c in first["checks"]:
                lines.append(f"| {c['name']} | {c['target']} | {measured_text(c['measured'])} "
                             f"| {'yes' if c['ok'] else '**no**'} |")
        else:
            names = [c["name"] for c in first["checks"]]
            by_run = [{c["name"]: c for c in r["checks"]} for r in runs]
            every = [n for n in names if all(n in b and b[n]["ok"] for b in by_run)]
            per_run = ", ".join(f"{sum(c['ok'] for c in r['checks'])}/{len(r['checks'])}"
                                for r in runs)
            cols = " | ".join(f"run {i + 1}" for i in range(len(runs)))
            lines += [f"## {name} ({len(runs)} runs, one after another)", "",
                      f"{_machine_line(first['machine'])} Checks met in every run: "
                      f"{len(every)}/{len(names)}; per run: {per_run}.", "",
                      f"| check | target | {cols} | met in every run |",
                      "| --- | --- | " + " | ".join("---" for _ in runs) + " | --- |"]
            for n in names:
                cells = []
                for b in by_run:
                    c = b.get(n)
                    cells.append("-" if c is None else measured_text(c["measured"])
                                 + ("" if c["ok"] else " **(no)**"))
                lines.append(f"| {n} | {by_run[0][n]['target']} | "
                             + " | ".join(cells) + f" | {'yes' if n in every else '**no**'} |")
        lines.append("")
        if name in DETAILS:
            if len(runs) > 1:
                lines += ["Details of run 1:", ""]
            lines += DETAILS[name](first["rows"]) + [""]
    return "\n".join(lines)


def summary(out: dict) -> str:
    lines = [f"bench {out['bench']}: {sum(c['ok'] for c in out['checks'])}/"
             f"{len(out['checks'])} checks met"]
    for c in out["checks"]:
        lines.append(f"  [{'ok' if c['ok'] else 'MISS'}] {c['name']}: "
                     f"{measured_text(c['measured'])} "
                     f"(target {c['target']})")
    return "\n".join(lines)
