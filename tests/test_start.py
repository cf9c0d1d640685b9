"""The README's first command: ./start.sh opens the course, even as root, on loopback only."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_start_sh_serves_start_here_on_loopback_with_a_token(tmp_path):
    port = _free_port()
    log = (tmp_path / "jupyter.log").open("w+")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    proc = subprocess.Popen(["bash", "start.sh", "--no-browser", f"--ServerApp.port={port}",
                             "--ServerApp.port_retries=0"], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        token, deadline = None, time.monotonic() + 120
        while token is None and time.monotonic() < deadline:
            assert proc.poll() is None, "start.sh exited:\n" + Path(log.name).read_text()
            m = re.search(rf"http://127\.0\.0\.1:{port}/lab/tree/notebooks/00_start_here"
                          r"\.ipynb\?token=(\w+)",
                          Path(log.name).read_text())
            token = m and m[1]
            time.sleep(0.3)
        assert token, "no URL with a token within 120 s:\n" + Path(log.name).read_text()
        base = f"http://127.0.0.1:{port}"
        status, page = _get(f"{base}/lab/tree/notebooks/00_start_here.ipynb?token={token}")
        assert status == 200 and "JupyterLab" in page
        status, body = _get(f"{base}/api/contents/notebooks/00_start_here.ipynb?token={token}")
        assert status == 200 and '"name": "00_start_here.ipynb"' in body
        # The root is the repository: labs/ and solutions/ are reachable too.
        assert _get(f"{base}/api/contents/labs?token={token}")[0] == 200
        assert _get(f"{base}/api/contents/notebooks/00_start_here.ipynb")[0] == 403
        server = psutil.Process(proc.pid)  # bash exec'd into jupyter: the same pid
        listening = [c.laddr.ip for c in server.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and set(listening) <= {"127.0.0.1"}, listening
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"
