"""Isolation of a submission: what the grader runs of a learner's code runs in a sandbox.

A sandbox is a set of Linux namespaces made by util-linux's `unshare` (mount, network, pid,
ipc, uts), entered as root and then left for a user id of its own before any of the
learner's code starts:

- network: its own loopback only (brought up; clusters use it), nothing else is reachable;
- files: every mount is remounted read-only; /tmp, /var/tmp, /dev/shm, /root, /home, the
  instructor's home and the folders being graded are hidden under empty private tmpfs; the
  submission's own folder (a copy the grader made) is the one place it can write;
- processes: its own pid namespace (it cannot see or signal the grader or other
  submissions; when the sandbox's first process ends, the kernel ends every other one), a
  user id nobody else has, no new privileges;
- limits: processes and threads (RLIMIT_NPROC, plus a pids cgroup where one can be made),
  memory (a memory cgroup; else RLIMIT_AS per process), file size, no core dumps; the
  grader keeps the wall clock and kills the whole sandbox when it runs out.

This needs root (a grading VM, a CI job): the namespaces are made without a user namespace,
so the mounts can be remounted read-only and the user id dropped. Elsewhere `probe()` says
why not, the grader runs submissions unisolated, and every row says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import functools
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

SETUP_FAILED = 121  # exit code of a sandbox whose setup failed (before any learner code ran)


@dataclasses.dataclass(frozen=True)
class Limits:
    memory_mb: int = 4096  # the whole sandbox (cgroup), or each process (RLIMIT_AS)
    tasks: int = 512  # processes and threads of the submission's user id
    file_mb: int = 1024  # largest file it can write


@functools.lru_cache(maxsize=1)
def probe() -> tuple[str, str]:
    """("unshare", "") when submissions can be isolated here, else ("none", why not)."""
    if not sys.platform.startswith("linux"):
        return "none", f"isolation needs Linux namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return "none", ("the grader does not run as root, which isolation needs here "
                        "(namespaces, read-only remounts, a user id of its own)")
    exe = shutil.which("unshare")
    if exe is None:
        return "none", "util-linux's `unshare` is not installed"
    try:
        r = subprocess.run([exe, *_UNSHARE_FLAGS, "true"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "none", f"unshare did not run: {exc}"
    if r.returncode != 0:
        return "none", f"unshare failed: {r.stderr.strip()[:200]}"
    return "unshare", ""


_UNSHARE_FLAGS = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child",
                  "--mount-proc")


# --- cgroups (v1 controllers, or v2), best effort --------------------------------------------


def _own_cgroup_dir(controller: str) -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctls, path = line.split(":", 2)
        if controller in ctls.split(","):
            base = Path("/sys/fs/cgroup") / controller
            return base / path.lstrip("/") if base.is_dir() else None
    for line in lines:  # cgroup v2: one hierarchy
        if line.startswith("0::"):
            base = Path("/sys/fs/cgroup")
            return base / line[3:].lstrip("/")
    return None


def make_cgroups(limits: Limits) -> tuple[list[str], list[str]]:
    """Cgroups for one sandbox: (their directories, what they limit, e.g. "memory")."""
    name = f"clusterlab-grade-{os.getpid()}-{secrets.token_hex(4)}"
    settings = {
        "pids": {"pids.max": str(limits.tasks)},
        "memory": {"memory.limit_in_bytes": str(limits.memory_mb << 20),
                   "memory.memsw.limit_in_bytes": str(limits.memory_mb << 20),  # no swap
                   "memory.max": str(limits.memory_mb << 20), "memory.swap.max": "0"},
    }
    dirs: list[str] = []
    limited: list[str] = []
    for controller, values in settings.items():
        base = _own_cgroup_dir(controller)
        if base is None:
            continue
        d = base / name
        if str(d) in dirs:  # v2: one directory takes both
            made = d
        else:
            try:
                d.mkdir()
            except OSError:
                continue
            made = d
        wrote = False
        for key, value in values.items():
            if (made / key).exists():
                with contextlib.suppress(OSError):
                    (made / key).write_text(value)
                    wrote = wrote or key in ("pids.max", "memory.limit_in_bytes", "memory.max")
        if str(made) not in dirs:
            dirs.append(str(made))
        if wrote:
            limited.append(controller)
    return dirs, limited


def remove_cgroups(dirs: list[str]) -> None:
    """Kill whatever is still in them, then remove them."""
    for d in dirs:
        procs = Path(d) / "cgroup.procs"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                pids = [int(p) for p in procs.read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


# --- the command that runs a program in a sandbox ---------------------------------------------


@dataclasses.dataclass
class Spec:
    """What `_enter` (inside the new namespaces, still root) sets up before it runs `argv`."""
    argv: list[str]
    workdir: str  # the submission's private, writable folder (also its cwd and $HOME)
    uid: int
    hide: list[str]  # folders replaced by an empty tmpfs
    keep: list[str]  # folders that stay readable even under a hidden one (the Python used)
    cgroups: list[str]
    limits: Limits
    memory_by_cgroup: bool


def new_uid() -> int:
    """A user id no account has (so no file of the machine belongs to it)."""
    return 0x40000000 + secrets.randbelow(0x3FFFFFFF)


def command(spec: Spec) -> list[str]:
    """The argv that runs spec.argv in a new sandbox."""
    # Run as a script (stdlib only): importing the package would import every lab and torch.
    return [shutil.which("unshare") or "unshare", *_UNSHARE_FLAGS, sys.executable, "-P", "-s",
            str(Path(__file__).resolve()), json.dumps(dataclasses.asdict(spec))]


_PACKAGE = Path(__file__).resolve().parents[1]  # .../clusterlab


def default_hide(paths: list[str]) -> list[str]:
    """What a sandbox must not see: scratch space, homes, the submissions themselves, and,
    in a course checkout, its solutions and history."""
    hide = ["/tmp", "/var/tmp", "/dev/shm", "/run/user", "/root", "/home",
            os.path.expanduser("~"), str(_PACKAGE.parent / "solutions"),
            str(_PACKAGE.parent / ".git")]
    for p in paths:
        q = Path(p).resolve()
        hide.append(str(q if q.is_dir() else q.parent))
    return hide


def default_keep(extra: list[str] = ()) -> list[str]:
    """What a sandbox needs to read even under a hidden folder: the Python it runs, the
    package, PYTHONPATH, and `extra` (the folders of labs defined outside the package)."""
    keep = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix), str(_PACKAGE)}
    keep.update(os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(":") if p)
    keep.update(os.path.realpath(p) for p in extra)
    return sorted(keep)


# --- inside: `python -m clusterlab.labs.sandbox SPEC` as the namespaces' first process --------

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_NOATIME, _MS_NODIRATIME = 32, 4096, 1024, 2048
_MS_RELATIME = 1 << 21
_ST_TO_MS = ((os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC),
             (os.ST_NOATIME, _MS_NOATIME), (os.ST_NODIRATIME, _MS_NODIRATIME),
             (os.ST_RELATIME, _MS_RELATIME))


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    enc = (lambda s: None if s is None else s.encode())
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags),
                  enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mountpoints() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4]
        points.append(mp.encode().decode("unicode_escape"))  # \040 for spaces
    return points


def _read_only_everywhere() -> None:
    failed = []
    for mp in _mountpoints():
        if any(_under(mp, top) for top in ("/proc", "/sys", "/dev")):
            continue  # not file stores (and the uid drop keeps them from being written)
        try:
            flags = os.statvfs(mp).f_flag
            keep = sum(ms for st, ms in _ST_TO_MS if flags & st)
            _mount(None, mp, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | keep)
        except OSError as exc:
            failed.append((mp, exc))
    if any(mp == "/" for mp, _ in failed):
        raise OSError(f"could not remount / read-only: {failed[0][1]}")


def _loopback_up() -> None:
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, siocgifflags, ifr))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _hide_and_keep(spec: Spec) -> None:
    # Hold what must stay visible before anything is hidden: bind back through the fds.
    held = {p: os.open(p, os.O_RDONLY | os.O_DIRECTORY)
            for p in [*spec.keep, spec.workdir] if os.path.isdir(p)}
    hides = sorted({os.path.realpath(h) for h in spec.hide if h}, key=len)
    hidden: list[str] = []

    def cover(h: str) -> None:
        mode = "1777" if h in ("/tmp", "/var/tmp", "/dev/shm") else "0755"
        _mount("tmpfs", h, "tmpfs", _MS_NOSUID | _MS_NODEV,
               f"mode={mode},size={spec.limits.memory_mb}m")
        hidden.append(h)

    for h in hides:
        if h != "/" and not any(_under(h, done) for done in hidden) and os.path.isdir(h):
            cover(h)
    rebound: list[str] = []
    for path, fd in held.items():
        writable = path == spec.workdir
        if writable or any(_under(path, h) for h in hidden):
            os.makedirs(path, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND)
            # a bind keeps its source mount's read-only flag: set this one's own
            _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV
                   | (0 if writable else _MS_RDONLY))
            rebound.append(path)
        os.close(fd)
    for h in hides:  # a hidden folder inside one brought back (solutions/ in a checkout)
        if h not in hidden and any(_under(h, r) and h != r for r in rebound) and \
                os.path.isdir(h) and not _under(spec.workdir, h):
            cover(h)


def _limit(spec: Spec) -> None:
    lim = spec.limits
    resource.setrlimit(resource.RLIMIT_NPROC, (lim.tasks, lim.tasks))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim.file_mb << 20, lim.file_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not spec.memory_by_cgroup:
        resource.setrlimit(resource.RLIMIT_AS, (lim.memory_mb << 20, lim.memory_mb << 20))


def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig, pr_set_no_new_privs = 1, 38
    libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)  # the uid change cleared it


def _enter(spec: Spec) -> int:
    try:
        for d in spec.cgroups:
            Path(d, "cgroup.procs").write_text("0")  # "0": this process
        _loopback_up()
        _read_only_everywhere()
        _hide_and_keep(spec)
    except Exception as exc:  # noqa: BLE001 - setup failed: the grader says so, nothing ran
        print(f"sandbox setup failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return SETUP_FAILED
    child = os.fork()
    if child == 0:
        try:
            os.chdir(spec.workdir)
            _limit(spec)
            _drop_privileges(spec.uid)
            os.execvp(spec.argv[0], spec.argv)
        except BaseException as exc:  # noqa: BLE001
            print(f"sandbox setup failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            os._exit(SETUP_FAILED)
    # The namespace's init: reap orphans until the program ends; then the kernel ends the rest.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code  # killed by signal N: 128 + N


if __name__ == "__main__":
    raw = json.loads(sys.argv[1])
    raw["limits"] = Limits(**raw["limits"])
    sys.exit(_enter(Spec(**raw)))
