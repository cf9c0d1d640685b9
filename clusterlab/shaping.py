"""Kernel shaping: every node in its own network namespace, its NIC shaped by the real `tc`.

    with clusterlab.Cluster(nodes=4, nic="rate 1gbit", shaping="kernel") as cl: ...

For machines with root (workshop VMs). Node i lives in namespace `<tag>-n<i>` with one
interface, `eth0` (address 10.77.0.<i+1>/24), the end of a veth pair whose other end is a
port of a bridge in a namespace of its own (`<tag>-sw`, the switch). Nothing is added to
the host's own namespace: no interface, no address, no route, so the private subnet can
never clash with the host's, and no packet of a cluster leaves its namespaces.

The NIC spec becomes a root qdisc on each node's `eth0` (its egress, as netem on a real
NIC): `netem <spec>` where the kernel has sch_netem; where it has not (as on this course's
build machine), `tbf` for a `rate` (with its packet overhead), and any other impairment is
refused by name ("delay needs sch_netem, which this kernel lacks"), never dropped. Per-link
overrides (`links=`) become an htb with a class per overridden direction (`tc_commands`).

The ranks run inside their node's namespace (`enter` right after fork; `ip netns exec`
for torchrun users, see `clusterlab shape`), bind Gloo to `eth0` (GLOO_SOCKET_IFNAME) and
meet at a rendezvous store that rank 0 hosts on node 0's address. Their process group is
plain Gloo: the kernel does the shaping, the "netem" backend adds nothing on top.

Everything is tagged as ours, and always removed: names carry the owner's pid
(`cl<pid>-<k>-n0`), a state file in /run/clusterlab records what exists and who owns it,
`remove()` runs after errors and interrupts, the cluster's janitor runs it when the owner
is killed outright (kill -9), and every `up()` first sweeps what owners now dead left
behind. Removing a namespace removes its veth end (so the pair), its qdiscs and the bridge.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import psutil

from .netem import DEFAULT_LIMIT, Netem, _drops_packets
from .topology import Topology
from .wire import HEADER_BYTES

MODES = ("userspace", "kernel")
IFNAME = "eth0"  # the node's interface, the same name in every node's namespace
SUBNET = "10.77.0"  # node i is SUBNET.(i+1); exists only inside our namespaces
MAX_NODES = 250  # addresses .1 .. .250 of the /24
# The veth MTU: the largest a veth takes, so a TCP segment carries ~64 KiB as over loopback
# and as the link model's segments (clusterlab.wire.SEGMENT_BYTES) do.
MTU = 65535
ETH_HEADER = 14  # what the qdisc counts on top of the IP packet
STATE_DIR = "/run/clusterlab"  # tmpfs, like /run/netns: a reboot clears both
COMMAND_TIMEOUT = 10.0  # seconds any one ip/tc call may take
_NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"(cl(\d+)-(\d+))-(n\d+|sw)")  # a namespace of ours: <tag>-n<i> | <tag>-sw
_UNLIMITED_BPS = 100 * 10**9  # an htb class that is never the bottleneck here
_counter = itertools.count()


# --- what this machine can do ------------------------------------------------------------

@functools.cache
def _capabilities() -> dict:
    """The doctor's probe (a throwaway namespace: netns, netem, tbf), once per process."""
    from .doctor import kernel_shaping

    return kernel_shaping()


def check_available() -> None:
    """Raise RuntimeError saying why this machine cannot shape in the kernel (if it cannot)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise RuntimeError(
            "shaping='kernel' needs root: it creates network namespaces, veth pairs and "
            "qdiscs (as on a workshop VM). Without root (e.g. on Binder) use the default "
            "shaping='userspace', which emulates the same spec in the backend")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"shaping='kernel' needs the iproute2 tools; not found: "
                           f"{', '.join(missing)}")
    caps = _capabilities()
    if not caps["netns"]:
        raise RuntimeError("shaping='kernel' needs network namespaces, and this machine "
                           f"refused to create one ({caps['detail'] or 'ip netns add failed'})")


def kernel_has_netem() -> bool:
    return bool(_capabilities()["netem"])


# --- the spec, as tc arguments --------------------------------------------------------------

def _needs_netem(spec: Netem) -> list[str]:
    """The parts of `spec` that only sch_netem can apply (tbf shapes a rate, nothing else)."""
    parts = []
    if spec.delay_ns or spec.delay_correlation:
        parts.append("delay")
    if spec.jitter_ns:
        parts.append("jitter")
    if _drops_packets(spec.loss):
        parts.append("loss")
    for name in ("ecn", "duplicate", "corrupt", "reorder"):
        if getattr(spec, name):
            parts.append(name)
    if spec.cell_size or spec.cell_overhead:
        parts.append("a cell size or cell overhead on the rate")
    if spec.limit != DEFAULT_LIMIT:
        parts.append("limit (netem's packet count)")
    return parts


def _refuse_without_netem(spec: Netem, name: str) -> None:
    unsupported = _needs_netem(spec)
    if unsupported:
        verb = "needs" if len(unsupported) == 1 else "need"
        raise ValueError(
            f"{name}='{spec}': {' and '.join(unsupported)} {verb} sch_netem, which this kernel "
            "lacks (without it only a rate is shaped, by tbf or htb); emulate it instead: "
            "shaping='userspace' (the netem backend's CLUSTERLAB_* settings under torchrun)")


def _burst(spec: Netem, mtu: int) -> int:
    """Tokens for two full packets (a packet larger than the bucket could never be sent) or
    1 ms at the rate, whichever is more."""
    return max(2 * (mtu + ETH_HEADER), spec.rate_bps // 8 // 1000)


def qdisc_args(spec: Netem, *, netem: bool, mtu: int = MTU, name: str = "nic") -> list[str] | None:
    """The `tc qdisc add dev eth0 root ...` arguments that apply `spec` to a node's egress;
    None for no impairment. Without sch_netem (`netem=False`) only a rate can be applied,
    by tbf; anything else raises ValueError naming it (and `name`, the argument)."""
    if not isinstance(spec, Netem):
        raise TypeError(f"spec must be a Netem, got {spec!r}")
    if spec.is_noop:
        return None
    if netem:
        return ["netem", *str(spec).split()]
    _refuse_without_netem(spec, name)
    # A queue as long as netem's default of 1000 packets.
    args = ["tbf", "rate", f"{spec.rate_bps}bit", "burst", str(_burst(spec, mtu)),
            "limit", str(DEFAULT_LIMIT * (mtu + ETH_HEADER))]
    if spec.packet_overhead:
        args += ["overhead", str(spec.packet_overhead)]
    return args


def tc_commands(nic: Netem, links: Mapping[int, Netem] | None = None, *, netem: bool,
                mtu: int = MTU, src: int = 0) -> list[str]:
    """The `tc` commands (for `tc -batch`) that shape node `src`'s eth0: `nic` for all its
    egress but the directions in `links` ({dst_node: spec}), which get queues of their own,
    as the userspace model gives an overridden direction. Without overrides one root qdisc
    (`qdisc_args`); with them an htb: class 1:1 the NIC (the default), class 1:<dst+2> per
    override, chosen by destination address; an unimpaired direction bypasses the shaping.
    With sch_netem each class holds a netem leaf; without, the class's rate does the work."""
    links = dict(links or {})
    if not links:
        args = qdisc_args(nic, netem=netem, mtu=mtu)
        return [f"qdisc add dev {IFNAME} root {' '.join(args)}"] if args else []
    classes = {1: ("nic", nic, None)} if not nic.is_noop else {}
    for dst, spec in sorted(links.items()):
        classes[dst + 2] = (f"links[{src}->{dst}]", spec, dst)
    quantum = mtu + ETH_HEADER
    # No class for the default (an unimpaired NIC): htb sends unclassified packets directly.
    lines, filters = [f"qdisc add dev {IFNAME} root handle 1: htb default 1"], []
    for minor, (name, spec, dst) in classes.items():
        if dst is not None:  # flowid 1:0 is the qdisc itself: htb sends those directly
            flow = f"1:{minor}" if not spec.is_noop else "1:0"
            filters.append(f"filter add dev {IFNAME} parent 1: protocol ip prio 1 u32 match "
                           f"ip dst {SUBNET}.{dst + 1}/32 flowid {flow}")
        if spec.is_noop:
            continue
        if not netem:
            _refuse_without_netem(spec, name)
        # With netem its leaf applies the rate too; the class only needs to be fast enough.
        rate = spec.rate_bps if not netem else max(spec.rate_bps * 2, _UNLIMITED_BPS)
        overhead = f" overhead {spec.packet_overhead}" if spec.packet_overhead and not netem else ""
        burst = _burst(spec, mtu)
        lines.append(f"class add dev {IFNAME} parent 1: classid 1:{minor} htb rate {rate}bit "
                     f"burst {burst} cburst {burst} quantum {quantum}{overhead}")
        if netem:
            lines.append(f"qdisc add dev {IFNAME} parent 1:{minor} handle {minor}: netem {spec}")
    return lines + filters


def validate(topology: Topology, *, dilation: float = 1.0) -> None:
    """Everything `up()` would refuse for this topology, raised before anything is created."""
    if topology.nodes > MAX_NODES:
        raise ValueError(f"shaping='kernel' supports up to {MAX_NODES} nodes, got "
                         f"{topology.nodes}")
    if not topology.intra.is_noop:
        raise ValueError(f"intra='{topology.intra}' is not supported with shaping='kernel': "
                         "the processes of one node share its namespace's loopback; use "
                         "shaping='userspace'")
    if not topology.fabric.is_crossbar():
        raise ValueError(f"fabric='{topology.fabric}' is not supported with shaping='kernel': "
                         "the namespaces hang off one bridge (a crossbar); use "
                         "shaping='userspace'")
    check_available()
    scaled = topology.scaled(dilation)
    for src in range(topology.nodes):
        tc_commands(scaled.nic, _links_from(scaled.links, src), netem=kernel_has_netem(),
                    src=src)


def _links_from(links: Mapping[tuple[int, int], Netem], src: int) -> dict[int, Netem]:
    return {dst: spec for (a, dst), spec in links.items() if a == src}


# --- one shaped network ----------------------------------------------------------------------

def _ip(*args: str, batch: list[str] | None = None, check: bool = True) -> str:
    """Run `ip`/`tc` (args[0]); with `batch`, one process for many commands (-batch -)."""
    cmd = [*args, "-force", "-batch", "-"] if batch is not None else list(args)
    proc = subprocess.run(cmd, input="\n".join(batch or []) + "\n" if batch is not None
                          else None, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[:400]}")
    return proc.stdout


@dataclass(frozen=True)
class Network:
    """A shaped network of `nodes` namespaces on a bridge. Build it with `up()`."""

    tag: str
    nodes: int
    nic: Netem
    mtu: int = MTU
    persistent: bool = False
    links: Mapping[tuple[int, int], Netem] = field(default_factory=dict)

    @property
    def segment_bytes(self) -> int:
        """TCP payload per segment on eth0 (the MSS): the MTU less IPv4, TCP and timestamp
        headers; with the Ethernet header, each segment costs wire.HEADER_BYTES on top."""
        return self.mtu - (HEADER_BYTES - ETH_HEADER)

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def namespace(self, node: int) -> str:
        return f"{self.tag}-n{node}"

    @property
    def namespaces(self) -> list[str]:
        return [self.namespace(i) for i in range(self.nodes)] + [self.switch]

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    @property
    def master_addr(self) -> str:
        """Node 0's address: where the rendezvous store listens."""
        return self.address(0)

    def rank_env(self, node: int) -> dict[str, str]:
        """What a rank of `node` needs: its namespace, its interface, the store's address."""
        return {"CLUSTERLAB_NETNS": os.path.join(_NETNS_DIR, self.namespace(node)),
                "GLOO_SOCKET_IFNAME": IFNAME, "MASTER_ADDR": self.master_addr}

    def exec_prefix(self, node: int) -> list[str]:
        """The command prefix that runs a program in `node`'s namespace (torchrun users)."""
        return ["ip", "netns", "exec", self.namespace(node),
                "env", f"GLOO_SOCKET_IFNAME={IFNAME}", f"MASTER_ADDR={self.master_addr}"]

    def torchrun_args(self, node: int, *, procs_per_node: int = 1, port: int = 29500) -> list[str]:
        """torchrun's options for `node` (run under `exec_prefix`): c10d rendezvous at node
        0's address, hosted by node 0 (is_host: torchrun cannot tell from the host name),
        and this node's own address for the workers' store (not the host name's address,
        which the namespace cannot reach)."""
        return ["torchrun", "--nnodes", str(self.nodes), "--nproc-per-node",
                str(procs_per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"{self.master_addr}:{port}", "--rdzv-conf", f"is_host={int(node == 0)}",
                "--local-addr", self.address(node)]

    def qdisc(self, node: int) -> str:
        """What `tc qdisc show dev eth0` says in `node`'s namespace (the kernel's own word)."""
        return _ip("tc", "-n", self.namespace(node), "qdisc", "show", "dev", IFNAME).strip()

    def remove(self) -> None:
        """Delete the namespaces (with them the veths, qdiscs and bridge) and the state
        file. Idempotent; never raises for what is already gone."""
        with contextlib.suppress(OSError, subprocess.SubprocessError, RuntimeError):
            _ip("ip", batch=[f"netns del {ns}" for ns in self.namespaces
                             if os.path.exists(os.path.join(_NETNS_DIR, ns))], check=False)
        with contextlib.suppress(OSError):
            os.remove(_state_path(self.tag))


def _state_path(tag: str) -> str:
    return os.path.join(STATE_DIR, f"{tag}.json")


def _owner_record() -> dict:
    return {"owner": os.getpid(), "owner_started": psutil.Process().create_time()}


def _claim_tag(record: dict) -> str:
    """A fresh tag cl<pid>-<k>, claimed by creating its state file (O_EXCL) before any
    namespace exists, so a crash at any later point leaves something the sweep can find."""
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    while True:
        tag = f"cl{os.getpid()}-{next(_counter)}"
        if any(os.path.exists(os.path.join(_NETNS_DIR, f"{tag}-{s}")) for s in ("sw", "n0")):
            continue  # an earlier process with our pid left it: the sweep's business
        try:
            fd = os.open(_state_path(tag), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({**record, "tag": tag}, f)
        return tag


def up(nodes: int, nic: str | Netem | None = None, *,
       links: Mapping[tuple[int, int], str | Netem] | str | None = None, mtu: int = MTU,
       persistent: bool = False) -> Network:
    """Create `nodes` namespaces on a bridge, each NIC shaped by `nic` (and the directions
    in `links`, {(src_node, dst_node): spec} or "0->1=rate 10mbit; ...", by theirs); return
    the Network.

    persistent=False (a Cluster's network): owned by this process; its janitor, or the
    next `up()` after this process died, removes it. persistent=True (`clusterlab shape
    up`): outlives this process, until `remove()` / `clusterlab shape down`."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"nodes must be an integer 1..{MAX_NODES}, got {nodes!r}")
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not 1280 <= mtu <= MTU:
        raise ValueError(f"mtu must be an integer 1280..{MTU}, got {mtu!r}")
    topology = Topology.build(nodes, nic=nic, links=links)
    spec = topology.nic
    check_available()
    shaped = [tc_commands(spec, _links_from(topology.links, i), netem=kernel_has_netem(),
                          mtu=mtu, src=i) for i in range(nodes)]  # refuses before creating
    sweep()
    links_text = topology.to_env()["CLUSTERLAB_LINKS"]
    record = {**_owner_record(), "persistent": bool(persistent), "nodes": nodes,
              "nic": str(spec), "links": links_text, "mtu": mtu, "created": time.time()}
    net = Network(_claim_tag(record), nodes, spec, mtu, bool(persistent), topology.links)
    try:
        sw = net.switch
        root = [f"netns add {ns}" for ns in net.namespaces]
        root += [f"link add {IFNAME} netns {net.namespace(i)} mtu {mtu} type veth peer name "
                 f"n{i} netns {sw} mtu {mtu}" for i in range(nodes)]
        _ip("ip", batch=root)
        # IPv6 off on every port (addrgenmode none): no link-local address for Gloo to pick,
        # no router solicitations; the bridge without STP forwards at once.
        _ip("ip", "-n", sw, batch=[
            "link set lo up", "link add br0 type bridge", "link set br0 addrgenmode none",
            "link set br0 up",
            *itertools.chain.from_iterable(
                (f"link set n{i} addrgenmode none", f"link set n{i} master br0",
                 f"link set n{i} up") for i in range(nodes))])
        for i in range(nodes):
            ns = net.namespace(i)
            _ip("ip", "-n", ns, batch=[
                "link set lo up", f"link set {IFNAME} addrgenmode none",
                f"addr add {net.address(i)}/24 dev {IFNAME}", f"link set {IFNAME} up"])
            if shaped[i]:
                _ip("tc", "-n", ns, batch=shaped[i])
    except BaseException:  # an error or an interrupt half-way: nothing stays
        net.remove()
        raise
    return net


def networks() -> list[dict]:
    """The state records of every network of ours on this machine (live or left over)."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(STATE_DIR)):
            if name.endswith(".json"):
                with contextlib.suppress(OSError, ValueError), \
                        open(os.path.join(STATE_DIR, name)) as f:
                    out.append(json.load(f))
    return out


def find(tag: str) -> Network:
    """The network `tag` from its state file (for `clusterlab shape run/down`)."""
    for rec in networks():
        if rec.get("tag") == tag:
            topology = Topology.build(int(rec["nodes"]), nic=rec["nic"] or None,
                                      links=rec.get("links") or None)
            return Network(tag, topology.nodes, topology.nic, int(rec.get("mtu", MTU)),
                           bool(rec.get("persistent")), topology.links)
    raise ValueError(f"no shaped network named {tag!r}; `clusterlab shape list` shows them")


def _owner_alive(pid: int, started: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        return started is None or abs(proc.create_time() - started) < 0.01  # not a reused pid
    except psutil.Error:
        return False


def sweep() -> list[str]:
    """Remove what earlier runs left behind: namespaces named like ours and state files whose
    owner process is gone (persistent networks excepted). Returns the tags removed."""
    records = {rec.get("tag"): rec for rec in networks()}
    tags: dict[str, list[str]] = {}
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(_NETNS_DIR):
            m = _NAME.fullmatch(name)
            if m:
                tags.setdefault(m[1], []).append(name)
    removed = []
    for tag in sorted(set(tags) | set(records) - {None}):
        rec = records.get(tag, {})
        pid = int(rec.get("owner") or _NAME.fullmatch(f"{tag}-sw")[2])
        if rec.get("persistent") or _owner_alive(pid, rec.get("owner_started")):
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError, RuntimeError):
            _ip("ip", batch=[f"netns del {ns}" for ns in tags.get(tag, [])], check=False)
        with contextlib.suppress(OSError):
            os.remove(_state_path(tag))
        removed.append(tag)
    return removed


# --- inside a rank ---------------------------------------------------------------------------

def enter(path: str) -> None:
    """Move the calling process (single-threaded, just forked) into the network namespace at
    `path`: every socket it opens from now on lives there."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {path}: {os.strerror(err)}")
    finally:
        os.close(fd)
