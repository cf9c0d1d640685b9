"""The command line: doctor and bench produce what they promise and leave nothing behind."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest


def clusterlab(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "clusterlab.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_doctor_reports_the_machine_and_leaves_no_namespace():
    out = clusterlab("doctor", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["cores"] >= 1 and info["gloo"] is True
    assert info["timer_overshoot_us"]["p50"] >= 0
    # The floor is the first candidate delay whose median was within the tolerance.
    from clusterlab.doctor import MEDIAN_DELAY_TOLERANCE

    tried = info["faithful_floor"]["tried"]
    ok = [abs(r["median_error_us"]) <= MEDIAN_DELAY_TOLERANCE * r["delay_us"] for r in tried]
    assert not any(ok[:-1])
    assert (info["smallest_faithful_delay_us"] == tried[-1]["delay_us"]) == ok[-1]
    assert info["added_p99_us"] == tried[-1]["p99_error_us"]
    assert set(info["kernel_shaping"]) >= {"root", "netns", "netem", "tbf"}
    if shutil.which("ip"):
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "clusterlab-doctor" not in names


def test_dilation_needed_reaches_the_floor_with_a_whole_factor():
    from clusterlab.doctor import dilation_needed

    assert dilation_needed(2000, floor_us=500) == 1
    assert dilation_needed(2000, floor_us=2000) == 1
    assert dilation_needed(2000, floor_us=5000) == 3
    assert dilation_needed(100, floor_us=10000) == 100
    with pytest.raises(ValueError, match="busy"):
        dilation_needed(100, floor_us=None)
    with pytest.raises(ValueError, match="delay_us"):
        dilation_needed(0, floor_us=100)


def test_bench_writes_rows_and_checks(tmp_path):
    path = tmp_path / "launch.json"
    out = clusterlab("bench", "launch", "--quick", "-o", str(path))
    data = json.loads(path.read_text())
    assert set(data) == {"bench", "machine", "rows", "checks"}
    assert data["bench"] == "launch" and data["rows"]
    for c in data["checks"]:
        assert set(c) == {"name", "target", "measured", "ok"}
    # The exit code says whether every check was met.
    assert out.returncode == (0 if all(c["ok"] for c in data["checks"]) else 1)
    report = clusterlab("bench", "report", str(path))
    assert "| start 8 ranks (median) |" in report.stdout
    # The form of scripts written before `--json` meant stdout everywhere still works.
    old = clusterlab("bench", "report", "--json", str(path), "--json", str(path))
    assert old.returncode == 0 and "| start 8 ranks (median) |" in old.stdout, old.stderr


def test_unknown_bench_is_a_named_error():
    out = clusterlab("bench", "nosuch")
    assert out.returncode == 2 and "nosuch" in out.stderr


@pytest.mark.parametrize("argv", [[], ["frobnicate"]])
def test_usage_errors(argv):
    assert clusterlab(*argv).returncode == 2


def test_report_puts_repeated_runs_of_a_bench_side_by_side():
    from clusterlab.bench import check, markdown

    machine = {"cores": 2, "memory_gb": 1, "python": "3", "torch": "t"}

    def run(ks, ok_std):
        return {"bench": "launch", "machine": machine, "rows": [], "checks": [
            check("ks", "< 0.05", {"median": ks, "min": round(ks - 0.01, 2),
                                   "max": round(ks + 0.01, 2), "values": [ks]}, ks < 0.05),
            check("std", "0.93..1.07", 1.0, ok_std)]}

    text = markdown([run(0.02, True), run(0.03, False), run(0.06, True)])
    assert text.count("## launch") == 1 and "(3 runs, one after another)" in text
    assert "Checks met in every run: 0/2; per run: 2/2, 1/2, 1/2." in text
    assert "Measured before results recorded their date." in text
    dated = {**run(0.02, True), "machine": {**machine, "date": "2026-12-02 03:00 UTC",
                                             "commit": "abc1234"}}
    assert "Measured 2026-12-02 03:00 UTC at commit abc1234." in markdown([dated])
    assert "| ks | < 0.05 | 0.02 (0.01..0.03) | 0.03 (0.02..0.04) | 0.06 (0.05..0.07) **(no)** |" \
        " **no** |" in text


def test_version_is_the_package_version():
    import clusterlab as pkg

    out = clusterlab("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"clusterlab {pkg.__version__}"


@pytest.mark.parametrize("argv, usage", [
    (["labs", "list", "--bogus"], "usage: clusterlab labs"),
    (["doctor", "extra"], "usage: clusterlab doctor"),
    (["bench", "nosuch"], "usage: clusterlab bench"),
    (["bench", "launch", "stray.txt"], "usage: clusterlab bench"),
    (["shape", "down"], "usage: clusterlab shape"),
])
def test_a_subcommands_error_shows_its_own_usage(argv, usage):
    out = clusterlab(*argv, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith(usage), out.stderr


@pytest.mark.parametrize("argv", [["labs", "list"], ["quiz", "--list-topics"],
                                  ["quiz", "--seed", "1", "--no-progress"]])
def test_a_reader_that_stopped_ends_the_command_quietly(argv):
    """`clusterlab labs list | head -1`: the reader is gone before anything is written (its
    end of the pipe closed first, so this never depends on timing)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "clusterlab", *argv], stdout=write,
                              stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_labs_list_only_lists_that_lab():
    out = clusterlab("labs", "list", "--only", "02_ring_allreduce", timeout=60)
    assert out.returncode == 0, out.stderr
    labs = [line for line in out.stdout.splitlines() if not line.startswith(" ")]
    assert len(labs) == 1 and labs[0].startswith("02_ring_allreduce ")
    assert 'check("ring_allreduce")' in out.stdout
    bad = clusterlab("labs", "list", "--only", "99_nope", timeout=60)
    assert bad.returncode == 2 and "99_nope" in bad.stderr and "02_ring_allreduce" in bad.stderr


def test_an_old_json_path_becomes_out_with_a_note(capsys):
    from clusterlab.cli import legacy_json

    is_file = lambda tok: tok.endswith(".json")
    assert legacy_json(["bench", "fidelity", "--json", "r.json"], is_path=is_file) == \
        ["bench", "fidelity", "--out", "r.json"]
    assert legacy_json(["grade", "subs/", "--json=g.json"], is_path=is_file) == \
        ["grade", "subs/", "--out", "g.json"]
    assert "-o PATH" in capsys.readouterr().err
    # The new flag before a positional is left alone, and says nothing.
    assert legacy_json(["grade", "--json", "subs/"], is_path=is_file) == \
        ["grade", "--json", "subs/"]
    assert legacy_json(["bench", "report", "--json", "a.json", "--json", "b.json"],
                       is_path=is_file, to_input=True) == ["bench", "report", "a.json", "b.json"]
    assert capsys.readouterr().err == ""


def test_grade_without_the_course_extra_says_what_to_install(monkeypatch, capsys):
    import importlib.util

    from clusterlab.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "nbclient" else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        main(["grade", "submissions/"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "usage: clusterlab grade" in err
    assert "grade needs nbclient: pip install 'clusterlab[course]'" in err


def test_every_bench_reports_progress():
    import inspect

    from clusterlab import bench

    bench._load()
    for name, fn in bench.BENCHES.items():
        assert "tick()" in inspect.getsource(inspect.getmodule(fn)), name


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("terminal", [False, True])
def test_bench_progress_goes_to_stderr_and_leaves_the_result_alone(monkeypatch, capsys,
                                                                   terminal):
    from clusterlab import bench

    def fake(quick=False):
        for _ in range(3):
            bench.tick()
        return {"bench": "fake", "rows": [1, 2, 3], "checks": []}

    bench._load()
    monkeypatch.setitem(bench.BENCHES, "fake", fake)
    monkeypatch.setattr(bench, "PLAIN_EVERY_S", 0.0)
    err = _Terminal() if terminal else None
    if terminal:
        monkeypatch.setattr(sys, "stderr", err)
    else:
        monkeypatch.setitem(sys.modules, "tqdm", None)  # the fallback: tqdm not installed
    out = bench.run("fake")
    assert out == {"bench": "fake", "rows": [1, 2, 3], "checks": []}
    captured = capsys.readouterr()
    text = err.getvalue() if terminal else captured.err
    assert captured.out == "" and "bench fake" in text
    if terminal:  # tqdm's counter
        assert "3 rows" in text
    else:
        assert [ln.split(" (")[0] for ln in text.splitlines()] == [
            "bench fake: started", "bench fake: 1 rows", "bench fake: 2 rows",
            "bench fake: 3 rows", "bench fake: done, 3 rows"]
    bench.tick()  # outside `run`: nothing to report, no error
