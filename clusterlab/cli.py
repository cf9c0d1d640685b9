"""The `clusterlab` command: doctor, bench, quiz."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "quiz":  # its own options: `clusterlab quiz --help`
        from .quiz.cli import main as quiz_main

        return quiz_main(argv[1:])
    parser = argparse.ArgumentParser(prog="clusterlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="is this machine ready, and how precise can it emulate")
    doc.add_argument("--json", action="store_true", help="print the report as JSON")
    doc.add_argument("--no-latency", action="store_true", help="skip the two-rank latency probe")
    sub.add_parser("quiz", help="interview rehearsal in the terminal (clusterlab quiz --help)")
    b = sub.add_parser("bench", help="run a benchmark and write its JSON")
    b.add_argument("name", help="fidelity, overhead, launch, model, sim, monitor, widgets; or "
                   "'report' to turn JSON results (given with --json, repeatable) into "
                   "markdown")
    b.add_argument("--json", metavar="PATH", action="append",
                   help="write the full result (rows and checks) here")
    b.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    sys.exit(main())
