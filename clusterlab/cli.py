"""The `clusterlab` command: doctor, bench, quiz, labs, grade, shape, nettest."""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "quiz":  # its own options: `clusterlab quiz --help`
        from .quiz.cli import main as quiz_main

        return quiz_main(argv[1:])
    if argv and argv[0] == "nettest":  # its own options: `clusterlab nettest --help`
        from .nettest import main as nettest_main

        return nettest_main(argv[1:])
    parser = argparse.ArgumentParser(prog="clusterlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="is this machine ready, and how precise can it emulate")
    doc.add_argument("--json", action="store_true", help="print the report as JSON")
    doc.add_argument("--no-latency", action="store_true", help="skip the two-rank latency probe")
    sub.add_parser("quiz", help="interview rehearsal in the terminal (clusterlab quiz --help)")
    sub.add_parser("nettest", help="measure a cluster's network under torchrun, nccl-tests "
                   "style (clusterlab nettest --help)")
    b = sub.add_parser("bench", help="run a benchmark and write its JSON")
    b.add_argument("name", help="fidelity, overhead, launch, model, sim, monitor, widgets, "
                   "fabric, faults, soak, shaping; or "
                   "'report' to turn JSON results (given with --json, repeatable) into "
                   "markdown")
    b.add_argument("--json", metavar="PATH", action="append",
                   help="write the full result (rows and checks) here")
    b.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    g = sub.add_parser("grade", help="execute submitted lab notebooks and tabulate points")
    g.add_argument("paths", nargs="+", metavar="PATH", help="lab notebooks, or folders of them")
    g.add_argument("--json", metavar="PATH", help="also write the rows here (for a gradebook)")
    g.add_argument("--timeout", type=float, default=None,
                   help="seconds all of a notebook's cells may take, counted from its first cell; "
                        "the kernel's start has its own 60 s limit (default 300)")
    g.add_argument("--seed", type=int, default=None,
                   help="seed of the hidden checks' draws (default: fixed)")
    g.add_argument("--jobs", type=int, default=1,
                   help="notebooks graded at once, each in its own process (default 1: "
                   "labs that time clusters need the cores to themselves)")
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
    args = parser.parse_args(argv[:len(argv) - len(command) - 1] if command else argv)
    args.cmd = command

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
            outs = []
            for path in args.json or []:
                with open(path) as f:
                    outs.append(json.load(f))
            print(markdown(outs))
            return 0
        try:
            out = run(args.name, (args.json or [None])[-1], quick=args.quick)
        except ValueError as exc:
            parser.error(str(exc))
        print(summary(out))
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


def _grade(args, parser) -> int:
    from .labs.core import DEFAULT_SEED
    from .labs.grade import DEFAULT_TIMEOUT, all_passed, grade, table

    try:
        rows = grade(args.paths, timeout=args.timeout or DEFAULT_TIMEOUT,
                     seed=DEFAULT_SEED if args.seed is None else args.seed, jobs=args.jobs,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0 if all_passed(rows) else 1


def _labs(args, parser) -> int:
    from pathlib import Path

    from .labs import all_labs
    from .labs.build import build

    if args.action == "list":
        for lab in all_labs().values():
            print(f"{lab.id}  ({lab.points} points, after notebooks/{lab.follows})  {lab.title}")
            for ex in lab.exercises:
                hidden = sum(c.hidden for c in ex.checks)
                print(f"    check(\"{ex.id}\")  {len(ex.checks)} checks ({hidden} hidden), "
                      f"{ex.points} points")
        return 0
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
