"""Install the CPU build of torch into the running interpreter's environment (setup.sh).

Why: on Linux, PyPI serves `torch==X` as the CUDA build plus some twenty nvidia packages,
several GB that the course never uses. PyTorch's CPU wheels (`X+cpu`) live on its own index,
which binder/requirements.txt also names. The order of attempts:

1. Linux, PyTorch's CPU index reachable: `torch==X+cpu` from it (pip shows its progress);
2. Linux otherwise: `torch==X+cpu` from pip's configured sources (a wheel cache or mirror);
3. if neither works, or on macOS and Windows (whose PyPI wheels carry no CUDA): `torch==X`
   from the configured index, after one line that says what that means on Linux.

X is the pin in requirements.txt (one place). `python scripts/install_torch.py --plan`
prints the attempts for this machine without installing anything.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys
import urllib.request
from importlib import metadata
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"


def pinned_version(requirements: Path = REQUIREMENTS) -> str:
    """The X of the `torch==X` line in requirements.txt."""
    for line in requirements.read_text().splitlines():
        m = re.fullmatch(r"\s*torch==([\w.]+)\s*(#.*)?", line)
        if m:
            return m[1]
    raise SystemExit(f"{requirements}: no 'torch==<version>' line")


def index_reachable(url: str = CPU_INDEX, *, timeout: float = 10.0) -> bool:
    """Whether PyTorch's CPU index answers within `timeout` seconds (no DNS, a firewall or a
    proxy that refuses it all count as unreachable)."""
    try:
        with urllib.request.urlopen(f"{url}/torch/", timeout=timeout) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def plan(*, version: str, system: str, reachable: bool) -> list[list[str]]:
    """The pip arguments to try in order; the first that succeeds wins."""
    if system != "Linux":
        return [[f"torch=={version}"]]
    cpu = [f"torch=={version}+cpu"]
    return ([["--extra-index-url", CPU_INDEX, *cpu]] if reachable else []) + [cpu,
                                                                              [f"torch=={version}"]]


FALLBACK_NOTE = ("install_torch: the CPU build of torch {version} is not available here "
                 "(PyTorch's CPU index {index} {why}); installing torch=={version} from pip's "
                 "configured index instead. From PyPI on Linux that is the CUDA build, several "
                 "GB. To get the CPU build later: rm -rf .venv and rerun once {index} is "
                 "reachable.")


def installed() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    version, system = pinned_version(), platform.system()
    have = installed()
    dry_run = "--plan" in argv
    if not dry_run and have is not None and have.split("+")[0] == version:
        if system == "Linux" and not have.endswith("+cpu"):
            print(f"install_torch: torch {have} is already installed (not the CPU build: on "
                  "Linux, PyPI's build ships CUDA). To switch: rm -rf .venv, rerun setup.")
        return 0
    # Probed only when something may be installed: the probe can take its whole timeout.
    reachable = system == "Linux" and index_reachable()
    attempts = plan(version=version, system=system, reachable=reachable)
    if dry_run:
        for args in attempts:
            print("pip install " + " ".join(args))
        return 0
    for k, args in enumerate(attempts):
        if k == len(attempts) - 1 and system == "Linux":
            why = "was tried and failed" if reachable else "cannot be reached"
            print(FALLBACK_NOTE.format(version=version, index=CPU_INDEX, why=why),
                  file=sys.stderr)
        # The download from PyTorch's index shows pip's progress; the try from the configured
        # sources is silent (on a machine without a cached CPU wheel it can only fail, and
        # the note above says what happens next).
        quiet = "--extra-index-url" not in args and k < len(attempts) - 1
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
        if subprocess.run(cmd + ["-q"] * quiet, check=False, capture_output=quiet).returncode == 0:
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
