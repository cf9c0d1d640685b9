"""`clusterlab bench faults`: a representative part of the fault matrix meets its targets
(named errors within timeout + 2 s, nothing left behind, the next cluster runs), and the
checks do fail when a row misses."""

from __future__ import annotations

import pytest

from clusterlab.bench import faults

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftovers")]

# One cell per fault, spread over the four places; the three timeout-only faults run side by
# side (bench.faults.PARALLEL), so this costs about two timeouts plus ~1 s per other cell.
SUBSET = [("raise", "ddp"), ("sigkill", "collective"), ("sigkill_rank0", "p2p"),
          ("sigstop", "p2p"), ("return_early", "ddp"), ("mismatch", "collective"),
          ("interrupt", "collective"), ("kernel_restart", "before"),
          ("parent_sigkill", "p2p")]


def test_a_representative_part_of_the_matrix_meets_every_target():
    rows = faults.matrix(repeats=1, only=SUBSET)
    assert {(r["fault"], r["where"]) for r in rows} == set(SUBSET)
    checks = faults.matrix_checks(rows)
    missed = [c for c in checks if not c["ok"]]
    assert not missed, (missed, [(r["fault"], r["where"], r["error"], r["message"][:300])
                                 for r in rows])
    by_cell = {(r["fault"], r["where"]): r for r in rows}
    assert by_cell[("raise", "ddp")]["error"] == "RankError"
    assert "rank 0" in by_cell[("sigkill_rank0", "p2p")]["message"]  # the store's host
    assert by_cell[("sigstop", "p2p")]["seconds"] >= faults.TIMEOUT  # waited, not guessed
    assert all(r["ports_seen"] >= 2 for r in rows)  # the port check looked at something


def test_a_peer_killed_inside_ddp_backward_crashes_no_other_rank():
    # Python's Future.set_exception stores the exception as the future's value; DDP's
    # reducer read it as tensors and the surviving rank died by SIGSEGV in 2-4 of 10 runs
    # until the backend handed C++ a chained future with a real error.
    rows = faults.matrix(repeats=6, only=[("sigkill", "ddp"), ("sigkill_rank0", "ddp")])
    assert len(rows) == 12
    assert not [r["crashed"] for r in rows if r["crashed"]]
    bad = [(r["fault"], r["error"], r["named"], r["message"][:300]) for r in rows
           if not (r["error"] == "RankDied" and r["named"])]
    assert not bad, bad


def test_the_checks_fail_on_a_bad_row():
    good = {"kind": "fault", "fault": "raise", "where": "before", "error": "RankError",
            "message": "rank 1 raised RuntimeError while running cell: x", "seconds": 0.3,
            "leftover_processes": 0, "leftover_files": 0, "leftover_shm": [],
            "ports_bound": [], "next_run_ok": True}
    faults._judge(good, "raise", "before")
    assert all(c["ok"] for c in faults.matrix_checks([good]))
    for change in ({"leftover_processes": 1}, {"leftover_shm": ["x"]}, {"ports_bound": [5]},
                   {"seconds": faults.TIMEOUT + faults.SLACK + 0.1}, {"next_run_ok": False},
                   {"named": False}, {"right_type": False}):
        assert not all(c["ok"] for c in faults.matrix_checks([{**good, **change}])), change
    unnamed = {**good, "message": "something failed"}
    faults._judge(unnamed, "raise", "before")
    assert not unnamed["named"]
