"""The `clusterlab` command: doctor, bench, quiz, labs, grade, shape, nettest.

One meaning of `--json` everywhere: print the machine-readable result (JSON) on stdout
instead of the table. Files are written with `-o/--out PATH`; `bench report` reads its
files as arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# Until issue 25, `--json PATH` wrote a file in bench, grade and nettest and named input files
# in `bench report`; scripts written then keep working, with a note on stderr.
_LEGACY_JSON = ("clusterlab: `--json PATH` is now `-o PATH` (`--out PATH`); `--json` alone "
                "prints the JSON on stdout")


def legacy_json(argv: list[str], *, is_path, to_input: bool = False,
                quiet: bool = False) -> list[str]:
    """argv with the old `--json PATH` / `--json=PATH` rewritten as `--out PATH` (or, with
    `to_input`, as the positional input PATH, as `bench report` takes it now). `is_path(tok)`
    tells an old path from the next argument of the new flag; `quiet`: no note on stderr."""
    out, i, changed = [], 0, False
    while i < len(argv):
        tok = argv[i]
        value = None
        if tok.startswith("--json="):
            value = tok.split("=", 1)[1]
        elif tok == "--json" and i + 1 < len(argv) and is_path(argv[i + 1]):
            value = argv[i + 1]
            i += 1
        if value is None:
            out.append(tok)
        else:
            out += [value] if to_input else ["--out", value]
            changed = True
        i += 1
    if changed and not (to_input or quiet):
        print(_LEGACY_JSON, file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the command; a reader that stops early (`clusterlab labs list | head -1`) ends it
    quietly with 141 (128 + SIGPIPE, what a shell tool killed by SIGPIPE returns)."""
    try:
        code = _main(sys.argv[1:] if argv is None else list(argv))
        sys.stdout.flush()  # a pipe's buffer is written here: a closed reader fails here
        return code
    except BrokenPipeError:
        # Python's documented pattern: point stdout at devnull, so that the flush at exit
        # does not raise a second BrokenPipeError.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


def _version() -> str:
    from . import __version__

    return __version__


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "quiz":  # its own options: `clusterlab quiz --help`
        from .quiz.cli import main as quiz_main

        return quiz_main(argv[1:])
    if argv and argv[0] == "nettest":  # its own options: `clusterlab nettest --help`
        from .nettest import main as nettest_main

        return nettest_main(argv[1:])
    if argv[:2] == ["bench", "report"]:
        argv = legacy_json(argv, is_path=lambda tok: not tok.startswith("-"), to_input=True)
    elif argv[:1] in (["bench"], ["grade"]):
        # A path to write ends in .json; `grade --json submissions/` is the new flag.
        argv = legacy_json(argv, is_path=lambda tok: tok.endswith(".json"))
    parser = argparse.ArgumentParser(prog="clusterlab", description=__doc__)
    parser.add_argument("--version", action="version", version=f"clusterlab {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="is this machine ready, and how precise can it emulate")
    doc.add_argument("--json", action="store_true", help="print the report as JSON")
    doc.add_argument("--no-latency", action="store_true", help="skip the two-rank latency probe")
    sub.add_parser("quiz", help="interview rehearsal in the terminal (clusterlab quiz --help)")
    sub.add_parser("nettest", help="measure a cluster's network under torchrun, nccl-tests "
                   "style (clusterlab nettest --help)")
    b = sub.add_parser("bench", help="run a benchmark; or turn results into markdown (report)")
    b.add_argument("name", help="fidelity, overhead, launch, model, sim, monitor, widgets, "
                   "fabric, faults, soak, shaping, course (every notebook and solved lab: "
                   "quiet, on one CPU with 2 GB, beside two busy processes; about an hour on "
                   "2 cores); or 'report' to turn JSON results (the FILEs) into markdown")
    b.add_argument("files", nargs="*", metavar="FILE",
                   help="report: the JSON results to tabulate")
    b.add_argument("--json", action="store_true",
                   help="print the full result (rows and checks) as JSON instead of the summary")
    b.add_argument("-o", "--out", metavar="PATH", help="write the full result here")
    b.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    g = sub.add_parser(
        "grade", help="execute submitted lab notebooks and tabulate points",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Execute each submitted lab notebook in a fresh kernel, then run every "
        "check of its lab (hidden ones included) in a separate process on the objects the "
        "notebook defined, with a seed the notebook never sees. As root on Linux each "
        "submission runs in a sandbox (no network but its own loopback, only its own folder "
        "writable, limits on memory and processes); elsewhere each row says it was not "
        "isolated.",
        epilog="exit codes:\n"
        "  0  every notebook was graded and passed every check\n"
        "  1  graded: some points were lost, or some notebooks were not labs, crashed or\n"
        "     timed out (the learners' doing)\n"
        "  2  the grader failed (bad arguments, or it could not grade a notebook: the row\n"
        "     says 'grader error')")
    g.add_argument("paths", nargs="+", metavar="PATH", help="lab notebooks, or folders of them")
    g.add_argument("--json", action="store_true",
                   help="print the rows as JSON instead of the table")
    g.add_argument("-o", "--out", metavar="PATH",
                   help="also write the rows here as JSON (for a gradebook)")
    g.add_argument("--timeout", type=float, default=None,
                   help="seconds all of a notebook's cells may take, counted from its first cell; "
                        "the kernel's start has its own 60 s limit (default 300); the grader's "
                        "run of the checks gets as long again, plus 30 s to start")
    g.add_argument("--seed", type=int, default=None,
                   help="seed of the hidden checks' draws (default: a fresh secret one per "
                   "run; the JSON records it, so a grade can be reproduced)")
    g.add_argument("-j", "--jobs", type=int, default=1,
                   help="notebooks graded at once, each in its own processes (default 1: "
                   "labs that time clusters need the cores; 2 cores take -j 2)")
    g.add_argument("--no-sandbox", action="store_true",
                   help="run submissions without isolation (each row says so)")
    lb = sub.add_parser("labs", help="list the labs, or generate labs/ from solutions/")
    lb.add_argument("action", choices=["list", "build", "verify"],
                    help="list: labs and points; build: write labs/ from solutions/; "
                    "verify: exit 1 if labs/ is not what build would write")
    lb.add_argument("--root", default=".", help="the course checkout (default: .)")
    lb.add_argument("--only", metavar="LAB", help="just this lab (e.g. 02_ring_allreduce)")
    sh = sub.add_parser("shape", help="kernel-shaped network namespaces for torchrun (root)",
                        description="Nodes in network namespaces on a bridge, each NIC shaped "
                        "by the real tc (see clusterlab.shaping). up: create and print how to "
                        "run in them; run: run a command in a node's namespace; down: remove; "
                        "list: show ours.")
    sh.add_argument("action", choices=["up", "down", "run", "list"])
    sh.add_argument("tag", nargs="?", help="the network (as `up` printed it); for run, down")
    sh.add_argument("--nodes", type=int, default=2, help="up: how many nodes (default 2)")
    sh.add_argument("--nic", default="", help="up: netem spec of every node's egress, "
                    "e.g. 'rate 1gbit' (tbf where the kernel has no sch_netem)")
    sh.add_argument("--links", default="", help="up: per-direction overrides, e.g. "
                    "'0->1=rate 100mbit; 1->0=rate 10mbit' (htb classes)")
    sh.add_argument("--node", type=int, default=0, help="run: in which node (default 0)")
    sh.add_argument("--all", action="store_true", help="down: every network of ours")
    # `shape run TAG -- COMMAND ...`: everything after the first "--" is the command.
    command = argv[argv.index("--") + 1:] if argv[:1] == ["shape"] and "--" in argv else []
    args, extra = parser.parse_known_args(
        argv[:len(argv) - len(command) - 1] if command else argv)
    args.cmd = command
    # The subcommand's own usage with its error (argparse would show the top-level one).
    parser = {"doctor": doc, "bench": b, "grade": g, "labs": lb,
              "shape": sh}.get(args.command, parser)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")

    if args.command == "shape":
        return _shape(args, parser)
    if args.command == "grade":
        return _grade(args, parser)
    if args.command == "labs":
        return _labs(args, parser)

    if args.command == "doctor":
        from .doctor import collect, report

        info = collect(with_latency=not args.no_latency)
        print(json.dumps(info, indent=1) if args.json else report(info))
        return 0
    if args.command == "bench":
        from .bench import markdown, run, summary

        if args.name == "report":
            if args.json or args.out or args.quick:
                parser.error("bench report takes only its FILEs and prints markdown")
            outs = []
            for path in args.files:
                with open(path) as f:
                    outs.append(json.load(f))
            print(markdown(outs))
            return 0
        if args.files:
            parser.error(f"bench {args.name} takes no FILEs (got {' '.join(args.files)}); "
                         "write its result with -o PATH")
        try:
            out = run(args.name, args.out, quick=args.quick)
        except ValueError as exc:
            parser.error(str(exc))
        print(json.dumps(out, indent=1) if args.json else summary(out))
        return 0 if all(c["ok"] for c in out["checks"]) else 1
    return 2


def _shape(args, parser) -> int:
    from . import shaping

    try:
        if args.action == "up":
            net = shaping.up(args.nodes, args.nic or None, links=args.links or None,
                             persistent=True)
            print(f"network {net.tag}: {net.nodes} nodes, nic '{net.nic}' on each eth0: "
                  + (net.qdisc(0) if not net.nic.is_noop or net.links else "no qdisc")
                  + "".join(f"; {a}->{b}: " + (f"'{spec}'" if not spec.is_noop else "unimpaired")
                          for (a, b), spec in net.links.items()))
            for i in range(net.nodes):
                print(f"  node {i}: {net.address(i)}, namespace {net.namespace(i)}; run in it: "
                      f"clusterlab shape run {net.tag} --node {i} -- COMMAND (= "
                      f"{' '.join(net.exec_prefix(i))} COMMAND)")
            print("torchrun on every node I (the script uses init_process_group(\"gloo\"): "
                  "the kernel shapes, nothing to emulate):")
            for i in range(net.nodes):
                print(f"  clusterlab shape run {net.tag} --node {i} -- "
                      + " ".join(net.torchrun_args(i)) + " train.py")
            print(f"remove: clusterlab shape down {net.tag}")
            return 0
        if args.action == "list":
            for rec in shaping.networks():
                print(f"{rec['tag']}: {rec['nodes']} nodes, nic '{rec['nic']}', "
                      + ("persistent" if rec.get("persistent") else f"owner pid {rec['owner']}"))
            return 0
        if args.action == "down":
            if args.all == bool(args.tag):
                parser.error("shape down: name one network (TAG) or --all")
            # --all: the persistent networks and what dead owners left, not live clusters'.
            tags = ([r["tag"] for r in shaping.networks() if r.get("persistent")]
                    if args.all else [args.tag])
            for tag in tags:
                shaping.find(tag).remove()
            for tag in tags + (shaping.sweep() if args.all else []):
                print(f"removed {tag}")
            return 0
        # run
        cmd = args.cmd
        if not args.tag or not cmd:
            parser.error("shape run: usage: clusterlab shape run TAG --node I -- COMMAND ...")
        net = shaping.find(args.tag)
        if not 0 <= args.node < net.nodes:
            parser.error(f"shape run: --node {args.node} is not a node of {net.tag} "
                         f"(0..{net.nodes - 1})")
        sys.stdout.flush()
        os.execvp("ip", net.exec_prefix(args.node) + cmd)
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))
    return 2


def _needs(parser, command: str, *modules: str) -> None:
    """A clear error, not an ImportError, where the course extra is not installed (the
    engine's own dependencies leave out the notebook machinery)."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        parser.error(f"{command} needs {', '.join(missing)}: pip install 'clusterlab[course]'")


def _grade(args, parser) -> int:
    _needs(parser, "grade", "nbformat", "nbclient", "ipykernel")
    from .labs.grade import DEFAULT_TIMEOUT, Isolation, exit_code, grade, table

    info: dict = {}
    try:
        rows = grade(args.paths, timeout=args.timeout or DEFAULT_TIMEOUT, seed=args.seed,
                     jobs=args.jobs, info=info,
                     isolation=Isolation.detect(wanted=not args.no_sandbox),
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))  # exit code 2
    except Exception as exc:  # noqa: BLE001 - a grader failure must not look like lost points
        import traceback

        traceback.print_exc()
        print(f"clusterlab grade: the grader failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    result = {"grader": info, "rows": rows}
    print(json.dumps(result, indent=1) if args.json else table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return exit_code(rows)


def _labs(args, parser) -> int:
    from pathlib import Path

    from .labs import all_labs

    if args.action == "list":
        labs = all_labs()
        if args.only and args.only not in labs:
            parser.error(f"--only {args.only}: no such lab; choose from {', '.join(labs)}")
        for lab in labs.values():
            if args.only and lab.id != args.only:
                continue
            print(f"{lab.id}  ({lab.points} points, after notebooks/{lab.follows})  {lab.title}")
            for ex in lab.exercises:
                hidden = sum(c.hidden for c in ex.checks)
                print(f"    check(\"{ex.id}\")  {len(ex.checks)} checks ({hidden} hidden), "
                      f"{ex.points} points")
        return 0
    _needs(parser, f"labs {args.action}", "nbformat")
    from .labs.build import build

    root = Path(args.root)
    try:
        files = build(root, write=args.action == "build", only=args.only)
    except ValueError as exc:
        parser.error(str(exc))
    if args.action == "verify":
        stale = [rel for rel, text in files.items()
                 if not (root / rel).exists() or (root / rel).read_text() != text]
        if stale:
            print("out of date (run `clusterlab labs build`): " + ", ".join(stale))
            return 1
        print(f"labs/ is up to date ({len(files) // 2} labs)")
        return 0
    print(f"wrote {len(files) // 2} labs to {root / 'labs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
