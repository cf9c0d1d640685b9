"""What the browser tests drive: the course's JupyterLab, started as the README does, and a
notebook in Chromium used the way a learner uses it (keyboard, clicks, the rendered DOM).

Nothing here may outlive a test: the server, every kernel and every process a kernel
started are stopped and waited for; what is still alive afterwards fails the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "browser-artifacts"  # screenshots of failed browser tests (git-ignored)
NO_CHROMIUM = "skipped: no chromium (install with apt-get install chromium, or run .ci/run)"
WIDGET_ERROR = "Error displaying widget"  # what ipywidgets shows where a view failed


def find_chromium() -> str | None:
    """Debian's Chromium (a browser downloaded at test time cannot be fetched here)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(root: Path) -> None:
    """User settings of this server only: no autosave (a notebook run here is never written
    back to the repository) and no news or update checks (no network, no toast)."""
    files = {
        "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
            {"fetchNews": "false", "checkForUpdates": False},
    }
    for name, value in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


class JupyterServer:
    """`./start.sh --no-browser` on a free loopback port with its own token, in an environment
    without the test suite's CLUSTERLAB_* variables (a learner's kernel has none: under
    CLUSTERLAB_STATIC the explorers would draw static figures instead of widgets)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "jupyter.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> None:
        home = self.workdir
        _settings(home / "settings")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERLAB_")}
        env.update(JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
                   JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"),
                   JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
                   CLUSTERLAB_QUIZ_PROGRESS=str(home / "quiz_progress.json"))
        log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            ["bash", "start.sh", "--no-browser", f"--ServerApp.port={self.port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"start.sh exited ({self.proc.returncode}):\n{self.log()}")
            with contextlib.suppress(OSError):
                if self.api("GET", "/api/status")[0] == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def api(self, method: str, path: str) -> tuple[int, Any]:
        req = urllib.request.Request(self.base + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                body = r.read()
                return r.status, json.loads(body) if body else None
        except urllib.error.HTTPError as exc:
            return exc.code, None

    def url(self, path: str, workspace: str) -> str:
        """The page that opens `path` in a workspace of its own (nothing else reopens)."""
        return f"{self.base}/lab/workspaces/{workspace}/tree/{path}?token={self.token}"

    # --- kernels and their processes --------------------------------------------------------

    def kernel_id(self, path: str) -> str | None:
        status, sessions = self.api("GET", "/api/sessions")
        for s in sessions or []:
            if s.get("path") == path and s.get("kernel"):
                return s["kernel"]["id"]
        return None

    def kernel_process(self, kernel_id: str) -> psutil.Process | None:
        """The kernel's process: the server's child whose connection file names the id."""
        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children():
            with contextlib.suppress(psutil.Error):
                if any(kernel_id in arg for arg in child.cmdline()):
                    return child
        return None

    def stop_kernels(self, timeout: float = 20.0) -> list[str]:
        """Shut every session's kernel down through the REST API, as closing it in the UI
        does; wait for each kernel and everything it started. Returns what had to be
        killed (empty when all went by themselves)."""
        assert self.proc is not None
        procs = _tree(self.proc.pid, include_root=False)
        _, sessions = self.api("GET", "/api/sessions")
        for s in sessions or []:
            self.api("DELETE", f"/api/sessions/{s['id']}")
        return _reap(procs, timeout)

    def stop(self, timeout: float = 20.0) -> list[str]:
        """Stop the kernels, then the server (SIGTERM, then SIGKILL); returns what had to be
        killed, kernels' processes included."""
        if self.proc is None:
            return []
        left = []
        with contextlib.suppress(OSError):
            left = self.stop_kernels(timeout)
        procs = _tree(self.proc.pid, include_root=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            left.append(f"jupyter server {self.proc.pid}")
        return left + _reap([p for p in procs if p.pid != self.proc.pid], 5)


def _tree(pid: int, *, include_root: bool) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return ([root] if include_root else []) + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def live_descendants(proc: psutil.Process) -> set[int]:
    """Pids of `proc`'s descendants that are still running (zombies excluded)."""
    try:
        return {p.pid for p in proc.children(recursive=True) if _alive(p)}
    except psutil.NoSuchProcess:
        return set()


def _reap(procs: list[psutil.Process], timeout: float) -> list[str]:
    """Wait for `procs` to end; kill and name those still running after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in procs):
        time.sleep(0.1)
    left = []
    for p in procs:
        if _alive(p):
            with contextlib.suppress(psutil.Error):
                left.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
    return left


# --- a notebook in the browser ---------------------------------------------------------------

PROMPT = re.compile(r"\[(\d+)\]")


def solution_source(path: Path, cell: int) -> str:
    """A solved lab cell as a learner would type it: the code, without the solution markers
    and the task comments."""
    source = "".join(json.loads(path.read_text())["cells"][cell]["source"])
    keep = [line for line in source.splitlines()
            if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line
            and "# TASK:" not in line]
    return "\n".join(keep)


class NotebookPage:
    """One notebook opened in JupyterLab in a fresh browser context.

    Cells are addressed by their index in the .ipynb (the DOM holds every cell in order,
    markdown included); `run(i)` clicks into cell i and presses Ctrl+Enter, then waits for
    the prompt to show the execution count this kernel gives it.
    """

    def __init__(self, browser: Any, server: JupyterServer, path: str, workspace: str) -> None:
        self.server, self.path = server, path
        self.cells_json = json.loads((ROOT / path).read_text())["cells"]
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.executed = 0
        self.workspace = workspace

    def open(self) -> None:
        """Load JupyterLab on the notebook; wait for every cell and an idle kernel."""
        self.page.goto(self.server.url(self.path, self.workspace), timeout=60_000)
        self.page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
        want = len(self.cells_json)
        deadline = time.monotonic() + 30
        while (count := self.page.locator(".jp-Notebook .jp-Cell").count()) != want:
            assert time.monotonic() < deadline, \
                f"{self.path}: {count} cells in the page, {want} in the file"
            time.sleep(0.1)
        self.wait_idle(60)

    def cell(self, index: int) -> Any:
        return self.page.locator(".jp-Notebook .jp-Cell").nth(index)

    def index_of(self, marker: str) -> int:
        """Index of the first code cell whose source contains `marker`."""
        for i, c in enumerate(self.cells_json):
            if c["cell_type"] == "code" and marker in "".join(c["source"]):
                return i
        raise AssertionError(f"{self.path}: no code cell contains {marker!r}")

    def wait_idle(self, timeout_s: float) -> None:
        """The notebook's kernel is started, connected to this page and idle. (The toolbar's
        execution indicator alone says "idle" for a moment before any kernel exists.)"""
        deadline = time.monotonic() + timeout_s
        while True:
            kid = self.server.kernel_id(self.path)
            kernel = self.server.api("GET", f"/api/kernels/{kid}")[1] if kid else None
            if kernel and kernel["execution_state"] == "idle" and kernel["connections"] >= 1:
                break
            assert time.monotonic() < deadline, \
                f"{self.path}: no idle kernel connected within {timeout_s:.0f} s ({kernel})"
            time.sleep(0.2)
        self.page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first \
            .wait_for(state="attached", timeout=timeout_s * 1000)

    def prompt(self, index: int) -> str:
        return self.cell(index).locator(".jp-InputPrompt").first.text_content() or ""

    def run(self, index: int, timeout_s: float = 60) -> Any:
        """Run cell `index` from the keyboard (Ctrl+Enter in its editor); return the cell."""
        cell = self.cell(index)
        cell.locator(".jp-InputArea-editor").first.click()
        self.page.keyboard.press("Control+Enter")
        self.executed += 1
        self.wait_prompt(index, self.executed, timeout_s)
        return cell

    def wait_prompt(self, index: int, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (m := PROMPT.search(self.prompt(index))) is None or int(m[1]) != count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.path} cell {index} did not finish as execution "
                                     f"[{count}] within {timeout_s:.0f} s (prompt "
                                     f"{self.prompt(index)!r})")
            time.sleep(0.1)

    def menu(self, menu: str, item: str) -> None:
        """Click `item` in the menu bar's `menu`, as a learner does."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{menu}$")).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{item}$")).click()

    def clear_outputs(self) -> None:
        """Edit > Clear Outputs of All Cells: the saved prompts go, so that the counts the
        tests wait for can only come from this kernel."""
        self.menu("Edit", "Clear Outputs of All Cells")
        self.page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')]"
            ".every(p => !/\\d/.test(p.textContent))", timeout=10_000)

    def run_all(self, timeout_s: float = 120) -> None:
        """Run > Run All Cells from the menu bar; wait for every code cell's count."""
        self.menu("Run", "Run All Cells")
        code = [i for i, c in enumerate(self.cells_json) if c["cell_type"] == "code"]
        for i in code:
            self.executed += 1
            self.wait_prompt(i, self.executed, timeout_s)

    def output_text(self, index: int) -> str:
        return self.cell(index).locator(".jp-OutputArea").first.text_content() or ""

    def replace_source(self, index: int, text: str) -> None:
        """Select all of the cell's code and type `text` over it (inserted as typed, without
        the editor's auto-indent and bracket closing)."""
        self.cell(index).locator(".jp-InputArea-editor").first.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(text)

    def widget_errors(self) -> list[str]:
        """Every 'Error displaying widget' the page shows, with the text around it."""
        text = self.page.locator(".jp-Notebook").first.text_content() or ""
        return [text[max(0, m.start() - 80): m.end() + 160]
                for m in re.finditer(WIDGET_ERROR, text)]

    def screenshot(self, directory: Path, name: str) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        saved = []
        shot = directory / f"{name}.png"
        with contextlib.suppress(Exception):
            self.page.screenshot(path=str(shot), full_page=True, timeout=10_000)
            saved.append(shot)
        console = directory / f"{name}.console.txt"
        console.write_text("\n".join(self.console))
        saved.append(console)
        return saved

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.context.close()
