"""Benchmarks behind `clusterlab bench NAME --json PATH`.

Each bench returns {"bench", "machine", "rows", "checks"}: rows are raw enough to recompute
every check, and each check is {"name", "target", "measured", "ok"}. Figures are ratios or
are compared with what was configured in the same run, never with absolute expectations
about this (shared, noisy) machine's speed.
"""

from __future__ import annotations

import json
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
        faults,
        fidelity,
        launch,
        model,
        monitor_overhead,
        overhead,
        soak,
        widgets,
    )


def details(name: str):
    """Register a function rendering more markdown from a bench's rows (for RESULTS.md)."""
    def register(fn):
        DETAILS[name] = fn
        return fn

    return register


def run(name: str, path: str | None = None, quick: bool = False) -> dict:
    """Run bench `name`, write its JSON to `path` (if given), return it."""
    _load()
    if name not in BENCHES:
        raise ValueError(f"unknown bench {name!r}; choose from {', '.join(sorted(BENCHES))}")
    out = BENCHES[name](quick=quick)
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return out


def markdown(outs: list[dict]) -> str:
    """A RESULTS.md section per bench, generated from its JSON (figures are never typed in)."""
    _load()
    lines = []
    for out in outs:
        m = out["machine"]
        met = sum(c["ok"] for c in out["checks"])
        lines += [f"## {out['bench']}", "",
                  f"Machine: {m.get('cores')} cores, {m.get('memory_gb')} GB, python "
                  f"{m.get('python')}, torch {m.get('torch')}. Checks met: {met}/"
                  f"{len(out['checks'])}.", "",
                  "| check | target | measured | met |", "| --- | --- | --- | --- |"]
        for c in out["checks"]:
            lines.append(f"| {c['name']} | {c['target']} | {c['measured']} | "
                         f"{'yes' if c['ok'] else '**no**'} |")
        lines.append("")
        if out["bench"] in DETAILS:
            lines += DETAILS[out["bench"]](out["rows"]) + [""]
    return "\n".join(lines)


def summary(out: dict) -> str:
    lines = [f"bench {out['bench']}: {sum(c['ok'] for c in out['checks'])}/"
             f"{len(out['checks'])} checks met"]
    for c in out["checks"]:
        lines.append(f"  [{'ok' if c['ok'] else 'MISS'}] {c['name']}: {c['measured']} "
                     f"(target {c['target']})")
    return "\n".join(lines)
