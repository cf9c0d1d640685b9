"""The input half of `clusterlab bench faults`: generated netem strings and bad arguments.

Two promises of the engine, measured as counts instead of tested case by case:

1. Netem text. `generate(n, seed)` writes n netem strings, deterministically: about a third
   straight from the grammar (every keyword, abbreviation, unit, bare number and percent
   form `clusterlab.netem` supports), the rest the same strings mutated (tokens deleted,
   duplicated, swapped; bad units; negative, NaN, infinite, huge and 5 000-digit numbers;
   unicode; empty and whitespace-only text; keyword typos; percentages outside 0..100).
   `fuzz_netem` parses each one and sorts the outcome: a spec whose `str()` parses back to
   an equal spec (and that the link model, a topology and time dilation accept), or a
   ValueError that quotes a token of the input. Anything else -- another exception type, a
   message that names nothing, a round trip that changes the spec, a parse slower than
   `PARSE_LIMIT_S` -- is a failure and listed with its input.
2. Public arguments. `bad_arguments()` calls every public entry point (Cluster(...),
   Cluster.run, Netem, Netem.parse, Netem.scaled, Topology, Topology.build, and the CLUSTERLAB_*
   settings read by NetemConfig.from_env) with wrong types, negative, zero, NaN, infinite,
   huge and malformed values, and records whether a ValueError/TypeError naming the argument
   came back, and whether anything was left behind (child processes, scratch directories).

`checks(quick)` turns both into the bench's (rows, checks); X's faults bench appends them.
Nothing here starts rank processes except the one small cluster that checks `run()`'s
arguments (not in quick mode).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import signal
import tempfile
import time

from ..netem import DISTRIBUTIONS, KEYWORDS, Netem

PARSE_LIMIT_S = 2.0  # a parse slower than this counts as a hang (a normal one takes ~20 us)
FULL_COUNT, QUICK_COUNT = 10_000, 2_000
SEED = 13
EXAMPLES = 5  # failing inputs kept per kind in the rows

# --- generating netem strings ------------------------------------------------------------------


def _prefixes(keyword: str) -> list[str]:
    """Every abbreviation iproute2 resolves to `keyword` (first match in KEYWORDS order)."""
    out = []
    for n in range(1, len(keyword) + 1):
        word = keyword[:n]
        if next(k for k in KEYWORDS if k.startswith(word)) == keyword:
            out.append(word)
    return out


_ABBREV = {k: _prefixes(k) for k in KEYWORDS}
_TIME_UNITS = ["", "s", "ms", "us", "ns", "sec", "secs", "msec", "msecs", "usec", "usecs",
               "nsec", "nsecs"]
_RATE_UNITS = ["", "bit", "kbit", "mbit", "gbit", "tbit", "kibit", "mibit", "gibit", "tibit",
               "bps", "kbps", "mbps", "gbps", "tbps", "kibps", "mibps", "gibps", "tibps"]


def _case(rng: random.Random, unit: str) -> str:
    """Units ignore case: mix it."""
    return "".join(c.upper() if rng.random() < 0.3 else c for c in unit)


def _kw(rng: random.Random, keyword: str) -> str:
    choices = _ABBREV[keyword] + {"delay": ["latency"], "loss": ["drop"]}.get(keyword, [])
    return rng.choice(choices + [keyword] * 3)  # the full word most often


def _decimal(rng: random.Random, low: float, high: float, *, lead_digit: bool) -> str:
    """A number in [low, high] in one of strtod's forms: 5, 2.5, 5., .5, 1e-3, 2.5E+1."""
    value = rng.uniform(low, high)
    form = rng.randrange(6)
    if form == 0:
        text = str(int(value))
    elif form == 1:
        text = f"{value:.{rng.randrange(1, 4)}f}"
    elif form == 2:
        text = f"{int(value)}."
    elif form == 3 and not lead_digit and value < 1:
        text = f"{value:.3f}".lstrip("0")  # ".5"
    elif form == 4 and value > 0:
        text = f"{value:.2e}".replace("e+0", "e").replace("e-0", "e-")
    else:
        text = f"{value:g}".replace("e+", "E+") if value else "0"
    return text


def _time(rng: random.Random, *, lead_digit: bool = False, positive: bool = False) -> str:
    unit = rng.choice(_TIME_UNITS)
    high = {"": 1e9, "s": 50}.get(unit.rstrip("c"), 1e4)
    # positive: at least 1 (ns or more), so that reorder and distribution stay valid
    return _decimal(rng, 1 if positive else 0, high, lead_digit=lead_digit) + _case(rng, unit)


def _rate(rng: random.Random) -> str:
    return _decimal(rng, 1, 1000, lead_digit=True) + _case(rng, rng.choice(_RATE_UNITS))


def _percent(rng: random.Random, *, lead_digit: bool = True, positive: bool = False) -> str:
    text = _decimal(rng, 0.01 if positive else 0, 100, lead_digit=lead_digit)
    if positive and float(text.rstrip(".")) <= 0:
        text = "1"
    return text + ("%" if rng.random() < 0.5 else "")


def _int(rng: random.Random, low: int, high: int, *, c_base: bool) -> str:
    value = rng.randint(low, high)
    if c_base and value >= 0 and rng.random() < 0.3:
        return rng.choice([hex(value), "0" + oct(value)[2:], "0X" + format(value, "X")])
    return str(value)


def _clauses(rng: random.Random) -> list[list[str]]:
    """A valid set of clauses: each keyword at most once, the cross-keyword rules kept."""
    clauses: list[list[str]] = []
    delay = jitter = False
    if rng.random() < 0.7:
        delay = True
        words = [_kw(rng, "delay"), _time(rng, positive=True)]
        if rng.random() < 0.6:
            jitter = True
            words.append(_time(rng, lead_digit=True, positive=True))
            if rng.random() < 0.4:
                words.append(_percent(rng))
        clauses.append(words)
        if jitter and rng.random() < 0.5:
            clauses.append([_kw(rng, "distribution"), rng.choice(DISTRIBUTIONS)])
    loss = rng.random()
    drops = False
    if loss < 0.2:
        kind = rng.choice([[], ["random"]])
        clauses.append([_kw(rng, "loss"), *kind, _percent(rng, positive=True)]
                       + ([_percent(rng)] if rng.random() < 0.4 else []))
        drops = True
    elif loss < 0.3:
        clauses.append([_kw(rng, "loss"), "state", _percent(rng)]
                       + [_percent(rng) for _ in range(rng.randrange(5))])
        drops = True
    elif loss < 0.4:
        clauses.append([_kw(rng, "loss"), "gemodel", _percent(rng)]
                       + [_percent(rng) for _ in range(rng.randrange(4))])
        drops = True
    if drops and rng.random() < 0.3:
        clauses.append([_kw(rng, "ecn")])
    for name in ("duplicate", "corrupt"):
        if rng.random() < 0.25:
            clauses.append([_kw(rng, name), _percent(rng)]
                           + ([_percent(rng)] if rng.random() < 0.4 else []))
    if delay and rng.random() < 0.25:
        clauses.append([_kw(rng, "reorder"), _percent(rng, positive=True)]
                       + ([_percent(rng)] if rng.random() < 0.4 else []))
        if rng.random() < 0.4:
            clauses.append([_kw(rng, "gap"), _int(rng, 1, 100, c_base=True)])
    if rng.random() < 0.4:
        words = [_kw(rng, "rate"), _rate(rng)]
        for low, high in ((-64, 64), (0, 1500), (-64, 64))[: rng.randrange(4)]:
            words.append(_int(rng, low, high, c_base=True))
        clauses.append(words)
    if rng.random() < 0.2:
        clauses.append([_kw(rng, "limit"), _int(rng, 1, 10**6, c_base=False)])
    if rng.random() < 0.15:
        clauses.append([_kw(rng, "seed"), _int(rng, 0, 2**64 - 1, c_base=False)])
    rng.shuffle(clauses)  # keyword order is free
    if rng.random() < 0.05:
        clauses.insert(0, ["netem"])
    return clauses


def _join(rng: random.Random, tokens: list[str]) -> str:
    seps = [" "] * 8 + ["  ", "\t", "\n", " \u00a0"]  # str.split() also splits on NBSP
    text = "".join(t + rng.choice(seps) for t in tokens)
    return text if rng.random() < 0.5 else text.strip()


# Mutations: what a typo, a copy-paste accident or a hostile caller does to a valid string.
_BAD_NUMBERS = ["-5", "-0.1", "nan", "NaN", "inf", "-inf", "1e999", "1e-999", "1e99999999999",
                "1e-99999999999", "1e99999999999999999999", "0x", "0x1g", "1.2.3", "+", "-",
                ".", "e5", "1e", "18446744073709551616", "9" * 30, "9" * 5000, "1" * 20000 + "x",
                "\u0661", "\uff11", "\u00b2", "1\u200bms", "1ms\x00", "\ud800", "1Kbit",
                "1\u212aBIT", "1\u0130ms", "101%", "-1%", "100.0001", "100.5%", "1%%", "%",
                "1e2%", "1e3", "5ms%", "10ms\u00a0"]
_BAD_UNITS = ["mss", "m", "sek", "msecss", "kbitt", "kb", "kbs", "bits", "%", "mbit/s",
              "µs", "μs", "ms.", "e3", "MSx"]
_WORDS = ["Delay", "DELAY", "dealy", "delayy", "lossy", "los", "x", "random", "state",
          "gemodel", "slot", "distribution", "normal", "pareto", "paretonormal", "uniform",
          "gaussian", "netem", "ecn", "gap", "rate", "limit", "seed", "tc", "qdisc", "-",
          "--delay", "délay", "\u0434elay", "1", "0", ""]


def _mutate(rng: random.Random, tokens: list[str]) -> list[str]:
    tokens = list(tokens)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        i = rng.randrange(len(tokens)) if tokens else 0
        op = rng.randrange(9)
        if op == 0 and tokens:
            del tokens[i]
        elif op == 1 and tokens:
            tokens.insert(i, tokens[i])
        elif op == 2 and len(tokens) > 1:
            j = rng.randrange(len(tokens))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif op == 3 and tokens:  # replace the unit of a number
            m = re.match(r"[0-9.eE+-]*", tokens[i])
            tokens[i] = (m.group() or "1") + rng.choice(_BAD_UNITS)
        elif op == 4 and tokens:
            tokens[i] = rng.choice(_BAD_NUMBERS)
        elif op == 5:
            tokens.insert(i, rng.choice(_BAD_NUMBERS + _WORDS))
        elif op == 6 and tokens:  # keyword typo: drop, double or swap a letter, or upcase
            word = tokens[i]
            k = rng.randrange(max(1, len(word)))
            tokens[i] = rng.choice([word[:k] + word[k + 1:], word[:k] + word[k:k + 1] * 2
                                    + word[k + 1:], word[::-1], word.upper(), word + "s"])
        elif op == 7 and tokens:  # cut the text in the middle of a token
            tokens = tokens[:i] + [tokens[i][: rng.randrange(len(tokens[i]) + 1)]]
        else:
            tokens = rng.choice([[], [""], ["\t \n"], tokens + rng.sample(_WORDS, 2)])
    return [t for t in tokens if t != ""] if rng.random() < 0.9 else tokens


def generate(n: int, seed: int = SEED) -> list[tuple[str, bool]]:
    """n netem strings, the same for the same seed: (text, straight from the grammar)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tokens = [t for clause in _clauses(rng) for t in clause]
        if i % 3 == 0:
            out.append((_join(rng, tokens), True))
        else:
            out.append((_join(rng, _mutate(rng, tokens)), False))
    return out


# --- judging one parse -----------------------------------------------------------------------

_QUOTED = re.compile(r"'([^']*)'")


def names_a_token(message: str, text: str) -> bool:
    """Does the message quote something made of the input's tokens ('1e9ms', 'dist normal')?"""
    tokens = set(text.split())
    return any(q.split() and set(q.split()) <= tokens for q in _QUOTED.findall(message))


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Interrupt the block after `seconds` (main thread, POSIX); elsewhere just run it."""
    usable = hasattr(signal, "setitimer") and _in_main_thread()
    if not usable:
        yield
        return

    def alarm(*_):
        raise _Hang

    old = signal.signal(signal.SIGALRM, alarm)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)  # a caller's timer, if any
    t0 = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer:  # give the caller's timer back what is left of it (at least 1 ms)
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer - (time.monotonic() - t0)))


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _onward(spec: Netem) -> None:
    """What the engine does next with a parsed spec: link models, topology, dilation."""
    from ..link import LinkModel
    from ..topology import Topology

    for k in (1.0, 0.5, 10.0):
        try:
            scaled = spec.scaled(k)
        except ValueError as exc:  # dilation beyond 64-bit delays: a named error is right
            if "dilation k=" not in str(exc):
                raise
            continue
        link = LinkModel(scaled, seed=1, link_id=(0, 1))
        try:
            link.transmit(0, 3000)
        except RuntimeError as exc:
            # The link model's TCP gives up after 15 retransmissions of one segment, as
            # Linux does (heavy loss or corruption): documented, not a parser problem.
            if "retransmissions" not in str(exc):
                raise
    Topology.build(2, nic=spec, links={(0, 1): str(spec)})


def judge(text: str) -> tuple[str, str]:
    """('valid' | 'value_error' | a failure kind, detail) for one netem string."""
    t0 = time.perf_counter()
    try:
        with _time_limit(PARSE_LIMIT_S):
            spec = Netem.parse(text)
    except _Hang:
        return "hang", f"parse took > {PARSE_LIMIT_S} s"
    except ValueError as exc:
        if not names_a_token(str(exc), text):
            return "unnamed_value_error", str(exc)[:200]
        return "value_error", ""
    except Exception as exc:  # noqa: BLE001 - this is what the fuzz looks for
        return "other_exception", f"{type(exc).__name__}: {str(exc)[:200]}"
    elapsed = time.perf_counter() - t0
    if elapsed > PARSE_LIMIT_S:
        return "hang", f"parse took {elapsed:.2f} s"
    try:
        back = Netem.parse(str(spec))
    except Exception as exc:  # noqa: BLE001
        return "round_trip", f"str() = {str(spec)!r} does not parse: {exc}"
    if back != spec or str(back) != str(spec):
        return "round_trip", f"str() = {str(spec)!r} parses to {back!r}"
    try:
        _onward(spec)
    except Exception as exc:  # noqa: BLE001
        return "onward", f"{str(spec)!r}: {type(exc).__name__}: {str(exc)[:200]}"
    return "valid", ""


FAILURES = ("other_exception", "unnamed_value_error", "round_trip", "onward", "hang")


def fuzz_netem(n: int, seed: int = SEED) -> dict:
    """Counts of every outcome over `generate(n, seed)`, with example inputs for failures."""
    counts = dict.fromkeys(("valid", "value_error", *FAILURES), 0)
    grammar = grammar_rejected = 0
    examples: dict[str, list] = {}
    longest = 0.0
    t0 = time.perf_counter()
    for text, from_grammar in generate(n, seed):
        t1 = time.perf_counter()
        kind, detail = judge(text)
        longest = max(longest, time.perf_counter() - t1)
        counts[kind] += 1
        grammar += from_grammar
        if from_grammar and kind != "valid":
            grammar_rejected += 1
            examples.setdefault("grammar_rejected", []).append([text[:200], kind, detail])
        if kind in FAILURES and len(examples.setdefault(kind, [])) < EXAMPLES:
            examples[kind].append([text[:200], detail])
    examples["grammar_rejected"] = examples.get("grammar_rejected", [])[:EXAMPLES]
    return {"kind": "netem_fuzz", "seed": seed, "generated": n, "from_grammar": grammar,
            "grammar_rejected": grammar_rejected, **counts,
            "slowest_judge_s": round(longest, 4), "total_s": round(time.perf_counter() - t0, 2),
            "examples": {k: v for k, v in examples.items() if v}}


# --- bad public arguments ----------------------------------------------------------------------

_NAN, _INF = float("nan"), float("inf")


def _cluster(**kw):
    from ..cluster import Cluster

    return Cluster(**{"nodes": 2, **kw})


def _env_config(name: str, value: str):
    from ..backend import NetemConfig

    base = {"CLUSTERLAB_NIC": "delay 1ms"}
    return NetemConfig.from_env(2, {**base, name: value})


def _argument_cases() -> list[tuple[str, str, object, object]]:
    """(target, argument, bad value, call) for every public argument and its bad values."""
    from ..netem import LossRandom
    from ..topology import Topology

    cases: list[tuple[str, str, object, object]] = []

    def add(target, argument, values, call):
        for v in values:
            cases.append((target, argument, v, (lambda v=v: call(v))))

    counts = [0, -1, 1.5, 2.0, _NAN, _INF, "2", None, True, 10**6, 2**70]
    for arg in ("nodes", "procs_per_node"):
        add("Cluster", arg, counts, lambda v, a=arg: _cluster(**{a: v}))
        # (a Topology is only a description: the simulator's 10**6 nodes are fine)
        add("Topology", arg, counts[:-2], lambda v, a=arg: Topology(**{"nodes": 2, a: v}))
    specs = [5, 1.5, b"delay 1ms", ["delay", "1ms"], "delay", "delay -1ms", "bogus 1",
             "delay 1ms loss 101%", "delay nan", "\u0000"]
    for arg in ("nic", "intra"):
        add("Cluster", arg, specs, lambda v, a=arg: _cluster(**{a: v}))
        add("Topology.build", arg, specs, lambda v, a=arg: Topology.build(2, **{a: v}))
    links = [5, "0->1", "0->5=delay 1ms", "a->b=delay 1ms", "0->0=delay 1ms", [(0, 1)],
             {(0, 5): "delay 1ms"}, {(0, 1): 5}, {(0, 1): "bogus"}, {"ab": "delay 1ms"},
             {(0, 1, 2): "delay 1ms"}, {(-1, 1): "delay 1ms"}]
    add("Cluster", "links", links, lambda v: _cluster(links=v))
    add("Topology", "links", [{(0, 1): "delay 1ms"}, {(0, 5): Netem()}, {(1, 1): Netem()}],
        lambda v: Topology(2, links=v))
    add("Cluster", "seed", [-1, 1.5, _NAN, "1", None, True], lambda v: _cluster(seed=v))
    nums = [0, -1, _NAN, _INF, -_INF, "5", None, True, 1e300]
    add("Cluster", "timeout", nums, lambda v: _cluster(timeout=v))
    add("Cluster", "dilation", nums, lambda v: _cluster(dilation=v))
    add("Cluster", "algorithm", ["bogus", "", 5, None, "RING"], lambda v: _cluster(algorithm=v))
    add("Cluster", "segment_bytes", [0, -1, 1.5, "x", None, _NAN, True],
        lambda v: _cluster(segment_bytes=v))
    add("Cluster", "correlation", ["bogus", "", 5, None], lambda v: _cluster(correlation=v))
    add("Cluster", "threads", [-1, 1.5, "2", _NAN, True, 10**6],
        lambda v: _cluster(threads=v))
    add("Cluster", "start_method", ["bogus", "", 5], lambda v: _cluster(start_method=v))
    add("Cluster", "environ", ["abc", 5, {"A": 1}, {1: "a"}, [("A", "b")]],
        lambda v: _cluster(environ=v))
    add("Netem.parse", "text", [None, 5, b"delay 1ms", ["delay 1ms"]], Netem.parse)
    for field, bad in (("delay_ns", [-1, 1.5, "1ms", None, _NAN, 2**63]),
                       ("jitter_ns", [-1, 1.5, "1ms", _NAN, 2**63]),
                       ("delay_correlation", [-1, 101, _NAN, _INF, "5"]),
                       ("distribution", ["gauss", 5, None]),
                       ("loss", [5, "loss 1%", LossRandom]),
                       ("duplicate", [-1, 101, _NAN, "1"]),
                       ("reorder", [-1, 101, _NAN]),
                       ("gap", [-1, 1.5, 2**32]),
                       ("rate_bps", [-1, 1.5, "1mbit", _NAN, 2**70]),
                       ("packet_overhead", [2**31, 1.5, "4"]),
                       ("cell_size", [-1, 2**32, 1.5]),
                       ("limit", [0, -1, 1.5, "5", 2**32]),
                       ("seed", [-1, 1.5, "1", 2**64])):
        add("Netem", field, bad, lambda v, f=field: Netem(**{f: v}))
    add("Netem.scaled", "k", [0, -1, _NAN, _INF, "2", None],
        lambda v: Netem.parse("delay 1ms").scaled(v))
    add("Netem.scaled", "k", [1e300], lambda v: Netem.parse("delay 1s rate 1bit").scaled(v))
    env = {"CLUSTERLAB_DILATION": ["0", "-1", "nan", "inf", "x", "1e999"],
           "CLUSTERLAB_SEED": ["-1", "1.5", "x", "nan"],
           "CLUSTERLAB_ALGORITHM": ["bogus", "RING"],
           "CLUSTERLAB_CORRELATION": ["bogus"],
           "CLUSTERLAB_SEGMENT_BYTES": ["0", "-1", "1.5", "x", "1e3"],
           "CLUSTERLAB_PROCS_PER_NODE": ["0", "-1", "3", "x", "1.5"],
           "CLUSTERLAB_NIC": ["bogus", "delay -1ms", "delay"],
           "CLUSTERLAB_INTRA": ["bogus"],
           "CLUSTERLAB_LINKS": ["0->5=delay 1ms", "garbage", "0->1=bogus"],
           "CLUSTERLAB_TRACE": ["yes", "2"]}
    for name, values in env.items():
        add("NetemConfig.from_env", name, values, lambda v, n=name: _env_config(n, v))
    return cases


# How a message may name an argument besides its own name ("run() needs a function").
_ALIASES = {"fn": "function"}


def _named(argument: str, message: str) -> bool:
    text, name = message.lower(), argument.lower()
    return any(n in text for n in (name, name.replace("_", " "), _ALIASES.get(name, name)))


def _our_children() -> set[int]:
    import psutil

    with contextlib.suppress(Exception):
        return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}
    return set()


def _our_scratch() -> set[str]:
    root = tempfile.gettempdir()
    return {n for n in os.listdir(root) if n.startswith(f"clusterlab-{os.getpid()}-")}


def _outcome(target: str, argument: str, value, call) -> dict:
    procs, files = _our_children(), _our_scratch()
    row = {"kind": "bad_argument", "target": target, "argument": argument,
           "value": _short(repr(value))}
    try:
        with _time_limit(10.0):
            obj = call()
    except _Hang:
        row.update(error="hang", message="", named=False)
    except (ValueError, TypeError) as exc:
        row.update(error=type(exc).__name__, message=_short(str(exc)),
                   named=_named(argument, str(exc)))
    except Exception as exc:  # noqa: BLE001 - a wrong exception type is what we look for
        row.update(error=type(exc).__name__, message=_short(str(exc)), named=False)
    else:
        row.update(error=None, message=f"accepted: {_short(repr(obj))}", named=False)
        with contextlib.suppress(Exception):
            obj.close()
    row["leftover_processes"] = len(_our_children() - procs)
    row["leftover_files"] = len(_our_scratch() - files)
    row["ok"] = bool(row["named"] and not row["leftover_processes"] and not row["leftover_files"])
    return row


def _short(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _run_cases() -> tuple[list[tuple[str, str, object, object]], dict]:
    """Cluster.run's arguments, on one started 2-rank cluster (closed afterwards)."""
    import threading

    from ..cluster import Cluster

    holder: dict = {}

    def cluster():
        if "cl" not in holder:
            # started here, before any case is measured: its own ranks are no leftovers
            holder["cl"] = Cluster(nodes=2, nic="delay 1ms", timeout=20)
            holder["cl"].start()
        return holder["cl"]

    lock = threading.Lock()
    cluster()
    cases = [("Cluster.run", "fn", v, (lambda v=v: cluster().run(v)))
             for v in (None, 5, "print", object())]
    cases.append(("Cluster.run", "arguments", "a threading.Lock",
                  lambda: cluster().run(math.sqrt, lock)))
    return cases, holder


def bad_arguments(*, run_cluster: bool = True) -> list[dict]:
    """One row per (public argument, bad value)."""
    procs, files = _our_children(), _our_scratch()  # what was there before (other benches)
    rows = [_outcome(*case) for case in _argument_cases()]
    if run_cluster:
        cases, holder = _run_cases()
        try:
            rows += [_outcome(*case) for case in cases]
        finally:
            if "cl" in holder:
                holder["cl"].close()
        # and the cluster that saw them still closes cleanly: nothing of it is left
        time.sleep(0.2)
        rows.append({"kind": "bad_argument", "target": "Cluster.run", "argument": "(after close)",
                     "value": "", "error": None, "message": "", "named": True,
                     "leftover_processes": len(_our_children() - procs),
                     "leftover_files": len(_our_scratch() - files),
                     "ok": not (_our_children() - procs) and not (_our_scratch() - files)})
    return rows


# --- the bench's rows and checks ---------------------------------------------------------------


def checks(quick: bool = False) -> tuple[list[dict], list[dict]]:
    """(rows, checks) for `clusterlab bench faults`: the netem fuzz and the argument table."""
    from . import check

    fuzz = fuzz_netem(QUICK_COUNT if quick else FULL_COUNT)
    args = bad_arguments(run_cluster=not quick)
    bad = sum(fuzz[k] for k in FAILURES)
    out = [
        check(f"input: {fuzz['generated']} generated netem strings: valid (round trip, link "
              "model) or a ValueError quoting the offending token",
              "0 other outcomes", f"{fuzz['valid']} valid, {fuzz['value_error']} ValueError, "
              f"{bad} other ({', '.join(f'{k} {fuzz[k]}' for k in FAILURES if fuzz[k]) or '-'})",
              bad == 0),
        check("input: netem strings straight from the grammar that parse",
              f"{fuzz['from_grammar']}/{fuzz['from_grammar']}",
              f"{fuzz['from_grammar'] - fuzz['grammar_rejected']}/{fuzz['from_grammar']}",
              fuzz["grammar_rejected"] == 0),
        check("input: slowest netem parse + round trip + link model", f"< {PARSE_LIMIT_S} s",
              f"{fuzz['slowest_judge_s']} s", fuzz["slowest_judge_s"] < PARSE_LIMIT_S),
    ]
    unnamed = [f"{r['target']}({r['argument']}={r['value']}): {r['error'] or 'accepted'}"
               for r in args if not r["named"]]
    out.append(check("input: bad public arguments answered by a ValueError/TypeError naming "
                     "the argument", f"{len(args)}/{len(args)}",
                     f"{len(args) - len(unnamed)}/{len(args)}"
                     + (f"; not: {'; '.join(unnamed[:8])}" if unnamed else ""), not unnamed))
    left = sum(r["leftover_processes"] + r["leftover_files"] for r in args)
    out.append(check("input: processes or scratch dirs left by bad arguments", "0", left,
                     left == 0))
    return [fuzz, *args], out
