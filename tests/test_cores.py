"""`usable_cores`: the affinity mask, capped by a cgroup CPU quota (v1 and v2), never below 1."""

from __future__ import annotations

import os

import pytest

from clusterlab import cores


@pytest.fixture
def no_cgroup(tmp_path, monkeypatch):
    """A cgroup tree with no quota files: only the affinity mask counts."""
    monkeypatch.setattr(cores, "_CGROUP_ROOT", tmp_path)
    return tmp_path


def quota_of(root, self_cgroup_text):
    own = root / "self_cgroup"
    own.write_text(self_cgroup_text)
    return cores._cgroup_quota(root=root, self_cgroup=own)


def test_the_affinity_mask_sets_the_count(no_cgroup, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert cores.usable_cores() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert cores.usable_cores() == 3


def test_cgroup_v2_quota_in_the_process_own_cgroup(tmp_path):
    (tmp_path / "user.slice" / "job").mkdir(parents=True)
    (tmp_path / "user.slice" / "job" / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")  # the root's, not this process's
    assert quota_of(tmp_path, "0::/user.slice/job\n") == 1.5


def test_cgroup_v2_without_a_limit(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert quota_of(tmp_path, "0::/\n") is None


def test_cgroup_v1_quota_and_no_limit(tmp_path):
    cpu = tmp_path / "cpu,cpuacct" / "kubepods" / "pod1"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("100000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    assert quota_of(tmp_path, "4:cpu,cpuacct:/kubepods/pod1\n0::/\n") == 1.0
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert quota_of(tmp_path, "4:cpu,cpuacct:/kubepods/pod1\n") is None


def test_unreadable_or_garbled_files_mean_no_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert quota_of(tmp_path, "not a cgroup line\n") is None


def test_a_quota_caps_the_mask_rounding_up(no_cgroup, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: 1.5)
    assert cores.usable_cores() == 2
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: 0.5)
    assert cores.usable_cores() == 1


def test_this_machine_reports_at_least_one_and_at_most_its_cores():
    assert 1 <= cores.usable_cores() <= (os.cpu_count() or 1)
