"""What setup installs as torch, decided without a wheel cache: the CPU build from PyTorch's
CPU index on Linux (PyPI's `torch==X` there is the CUDA build), the plain pin elsewhere, and
one version in requirements.txt and binder/ alike. (Installing from PyTorch's index needs
the internet, which the tests do not use; the decision is what is tested.)"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("install_torch", ROOT / "scripts/install_torch.py")
install_torch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_torch)


def test_linux_asks_pytorchs_cpu_index_for_the_cpu_build_first():
    attempts = install_torch.plan(version="2.13.0", system="Linux", reachable=True)
    assert attempts[0] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu",
                           "torch==2.13.0+cpu"]
    assert attempts[-1] == ["torch==2.13.0"]  # only when the CPU build cannot be had


def test_linux_without_the_index_tries_a_cached_cpu_wheel_before_the_plain_pin():
    attempts = install_torch.plan(version="2.13.0", system="Linux", reachable=False)
    assert attempts == [["torch==2.13.0+cpu"], ["torch==2.13.0"]]
    assert not any("--extra-index-url" in a for a in attempts)


def test_macos_takes_the_plain_pin():
    # PyPI's macOS wheels carry no CUDA, and PyTorch's CPU index has no +cpu macOS build.
    assert install_torch.plan(version="2.13.0", system="Darwin", reachable=True) == [
        ["torch==2.13.0"]]


def test_the_fallback_says_what_it_installs_and_how_to_get_the_cpu_build():
    note = install_torch.FALLBACK_NOTE.format(version="2.13.0", index=install_torch.CPU_INDEX,
                                              why="cannot be reached")
    assert "torch==2.13.0" in note and "CUDA build" in note and "rm -rf .venv" in note


def test_one_torch_version_in_requirements_and_binder():
    version = install_torch.pinned_version()
    binder = (ROOT / "binder/requirements.txt").read_text()
    assert re.search(rf"^torch=={re.escape(version)}\+cpu$", binder, flags=re.M), binder
    assert install_torch.CPU_INDEX in binder


def test_a_requirements_file_without_a_torch_pin_is_refused(tmp_path):
    bad = tmp_path / "requirements.txt"
    bad.write_text("numpy==2.4.6\n")
    try:
        install_torch.pinned_version(bad)
    except SystemExit as e:
        assert "no 'torch==<version>' line" in str(e)
    else:
        raise AssertionError("a file without torch== was accepted")


def test_an_unreachable_index_is_reported_within_its_timeout():
    start = time.monotonic()
    assert not install_torch.index_reachable("http://127.0.0.1:9/whl/cpu", timeout=5)
    assert time.monotonic() - start < 30


def test_setup_installs_torch_through_the_script_before_the_pins():
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert setup.index("scripts/install_torch.py") < setup.index("-r requirements-dev.txt")


def test_plan_prints_the_attempts_without_installing():
    out = subprocess.run([sys.executable, str(ROOT / "scripts/install_torch.py"), "--plan"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    assert lines and all(line.startswith("pip install ") for line in lines)
    assert lines[-1] == f"pip install torch=={install_torch.pinned_version()}"
