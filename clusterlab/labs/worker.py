"""What `clusterlab grade` runs of a submission, in its sandbox (see sandbox.py), in two steps.

    python -P -s worker.py run NOTEBOOK TIMEOUT NAMES
        Execute the notebook's cells in a fresh kernel (TIMEOUT seconds for all of them,
        counted from the first), then ask the kernel for the objects named in NAMES (a JSON
        list: what the lab's checks need) and write them, pickled one by one, to EXPORT; write
        what happened (timeout, dead kernel, cells that raised) to RESULT. The kernel is the
        learner's, so both files are the learner's to write: the grader reads notes from
        RESULT, never points, and EXPORT holds nothing but the learner's own objects.

    python -P -s worker.py check LAB MODULES  (the seed as JSON on stdin)
        In a new process the notebook never ran in: import the lab's checks (MODULES: files
        of labs outside the package), from the grader's files, before the submission's folder
        is on sys.path; unpickle the objects; run every check of the lab, hidden ones
        included, with the seed; write one JSON line per check to stdout, which only this
        process holds (whatever the learner's code prints goes to OUTPUT instead).

Run as a script (`-P`: not from the submission's folder; `-s`: no user site, whose
directory is the submission's) so that nothing in the submission shadows what it imports.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time

EXPORT = ".clusterlab-objects.json"
RESULT = ".clusterlab-run.json"
OUTPUT = ".clusterlab-check-output.txt"
EXPORT_TIMEOUT = 60  # seconds the kernel has to pickle the objects after the last cell

_EXPORT_CODE = '''\
def __clusterlab_export(names, path):
    import base64, json, cloudpickle
    g = globals()
    objects, problems = {{}}, {{}}
    for n in names:
        if n in g:
            try:
                objects[n] = base64.b64encode(cloudpickle.dumps(g[n])).decode()
            except Exception as exc:
                problems[n] = f"{{type(exc).__name__}}: {{exc}}"[:300]
    with open(path, "w") as f:
        json.dump({{"objects": objects, "problems": problems}}, f)
__clusterlab_export({names!r}, {path!r})
del __clusterlab_export
'''


def run(notebook: str, timeout: float, names: list[str]) -> int:
    import nbformat
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.read(notebook, as_version=4)
    deadline: list[float] = []

    def remaining(_cell) -> int:
        if not deadline:
            deadline.append(time.monotonic() + timeout)
        return max(1, round(deadline[0] - time.monotonic()))

    client = NotebookClient(nb, kernel_name="python3", allow_errors=True, startup_timeout=60,
                            timeout_func=remaining,
                            resources={"metadata": {"path": os.getcwd()}})
    error, t0, t1 = "", None, None
    try:
        with client.setup_kernel():
            t0 = time.monotonic()
            for i, cell in enumerate(list(nb.cells)):
                if deadline and time.monotonic() >= deadline[0]:
                    error = f"timed out: the notebook did not finish within {timeout:g} s"
                    break
                try:
                    client.execute_cell(cell, i)
                except CellTimeoutError:
                    error = f"timed out: the notebook did not finish within {timeout:g} s"
                    run_sync(client.km.interrupt_kernel)()
                    break
            t1 = time.monotonic()
            export = nbformat.v4.new_code_cell(_EXPORT_CODE.format(names=names, path=EXPORT))
            nb.cells.append(export)
            client.timeout_func = lambda _cell: EXPORT_TIMEOUT
            try:
                client.execute_cell(export, len(nb.cells) - 1)
            except CellTimeoutError:
                error = error or "the kernel did not hand over its objects in time"
    except DeadKernelError:
        error = "the kernel died (a crash, os._exit, or too much memory)"
    except Exception as exc:  # noqa: BLE001 - any failure of one notebook is a note
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
    cell_errors = []
    for i, cell in enumerate(nb.cells[:-1] if nb.cells else []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                cell_errors.append(f"cell {i}: {out.get('ename')}: "
                                   f"{str(out.get('evalue', ''))[:160]}")
    seconds = 0.0 if t0 is None else (t1 or time.monotonic()) - t0
    with open(RESULT, "w") as f:
        json.dump({"error": error, "cell_errors": cell_errors[:50], "seconds": seconds}, f)
    return 0


def check(lab_id: str, modules: list[list[str]]) -> int:
    # Our channel is the stdout we were given; the learner's prints go to a file.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    sink = os.open(OUTPUT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    seed = int(json.loads(sys.stdin.readline())["seed"])
    import importlib.util

    for name, path in modules:  # labs outside the package (tests' toy lab), before the rest
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    from clusterlab.labs import all_labs
    from clusterlab.labs.core import Unavailable, run_checks

    lab = all_labs()[lab_id]
    sys.path.append(os.getcwd())  # the learner's helper modules; last, shadowing nothing
    namespace: dict = {}
    try:
        with open(EXPORT) as f:
            exported = json.load(f)
        objects, problems = dict(exported["objects"]), dict(exported["problems"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        objects, problems = {}, {}
        channel.write(json.dumps({"no_objects": f"{type(exc).__name__}"}) + "\n")
    import cloudpickle

    for name, reason in problems.items():
        namespace[str(name)] = Unavailable(f"pickling it failed: {str(reason)[:300]}")
    for name, blob in objects.items():
        try:
            namespace[str(name)] = cloudpickle.loads(base64.b64decode(blob))
        except Exception as exc:  # noqa: BLE001 - the learner's object, the learner's row
            namespace[str(name)] = Unavailable(f"unpickling it failed: {type(exc).__name__}: "
                                               f"{str(exc)[:200]}")
    for ex, c in lab.checks:
        channel.write(json.dumps({"started": [ex.id, c.name]}) + "\n")
        t0 = time.monotonic()
        try:
            (o,) = run_checks(ex.id, namespace, hidden=True, seed=seed, only=c.name).outcomes
            outcome = [o.exercise, o.check, o.status, o.message, o.seconds]
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt from the learner's code
            outcome = [ex.id, c.name, "fail", f"your code raised {type(exc).__name__}, which "
                       "stopped the check", time.monotonic() - t0]
        channel.write(json.dumps({"outcome": outcome}) + "\n")
    channel.write(json.dumps({"done": True}) + "\n")
    channel.flush()
    os._exit(0)  # not interpreter shutdown: nothing the learner left running gets a say


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        return run(argv[1], float(argv[2]), json.loads(argv[3]))
    if argv[:1] == ["check"]:
        return check(argv[1], json.loads(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
