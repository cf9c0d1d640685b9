"""Topology: N nodes x P processes per node, a NIC per node, an intra-node link.

Rank r lives on node r // P (contiguous, as torchrun numbers ranks). The `nic` spec acts like
`tc qdisc add dev eth0 root netem ...` on every node: it impairs each node's EGRESS, so a
message between two nodes passes it once and a ping-pong round trip twice. All processes of a
node share that NIC (one queue, one rate), so their traffic contends. Processes of one node
talk over the `intra` link (unimpaired by default), one per sending process. Per-link
overrides give one direction between two nodes its own spec (and its own queue), for a slow
link or an asymmetric network.

The same topology is described by environment variables, so that an ordinary script calling
`dist.init_process_group("netem")` under torchrun picks it up:

    CLUSTERLAB_NIC="delay 2ms 500us rate 1gbit"   each node's NIC egress
    CLUSTERLAB_INTRA="delay 20us"                 between processes of one node
    CLUSTERLAB_PROCS_PER_NODE=2                   default 1: every rank is its own node
    CLUSTERLAB_LINKS="0->1=delay 10ms; 1->0=rate 100mbit"   per-direction overrides
    CLUSTERLAB_FABRIC="leafspine nodes_per_leaf=4 spines=2"  the switches behind the NICs

`fabric` (`clusterlab.fabric`) says what a message crosses after its sender's NIC: nothing
(the crossbar, the default), or the switch ports of a leaf-spine or rail-optimised fabric.
A rail-optimised fabric gives every process its own NIC, so a node's processes no longer
share one egress queue.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .fabric import CROSSBAR, Fabric, as_fabric
from .netem import Netem, as_netem

NO_IMPAIRMENT = Netem()

_LINK_ITEM = re.compile(r"^\s*(\d+)\s*->\s*(\d+)\s*=(.*)$")


@dataclass(frozen=True)
class Topology:
    """Where each rank lives and what every direction between two ranks looks like."""

    nodes: int
    procs_per_node: int = 1
    nic: Netem = NO_IMPAIRMENT
    intra: Netem = NO_IMPAIRMENT
    links: Mapping[tuple[int, int], Netem] = field(default_factory=dict)
    fabric: Fabric = CROSSBAR

    def __post_init__(self) -> None:
        for name in ("nodes", "procs_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("nic", "intra"):
            if not isinstance(getattr(self, name), Netem):
                raise TypeError(f"{name} must be a Netem spec, got {getattr(self, name)!r}")
        if not isinstance(self.links, Mapping):
            raise TypeError(f"links must map (src_node, dst_node) to a Netem, got {self.links!r}")
        for key, spec in self.links.items():
            if not (isinstance(key, tuple) and len(key) == 2
                    and all(isinstance(k, int) and not isinstance(k, bool) for k in key)):
                raise ValueError(f"links: key {key!r} must be a (src_node, dst_node) pair")
            src, dst = key
            for end in (src, dst):
                if not 0 <= end < self.nodes:
                    raise ValueError(
                        f"links: node {end} in override {src}->{dst} does not exist "
                        f"(nodes are 0..{self.nodes - 1})"
                    )
            if src == dst:
                raise ValueError(f"links: {src}->{dst} is not a link between two nodes")
            if not isinstance(spec, Netem):
                raise TypeError(f"links[{src}->{dst}] must be a Netem spec, got {spec!r}")
        if not isinstance(self.fabric, Fabric):
            raise TypeError(f"fabric must be a clusterlab.fabric description, got {self.fabric!r}")
        self.fabric.check(self.nodes, self.procs_per_node)

    @classmethod
    def build(
        cls,
        nodes: int,
        procs_per_node: int = 1,
        nic: str | Netem | None = None,
        intra: str | Netem | None = None,
        links: Mapping[tuple[int, int], str | Netem] | str | None = None,
        fabric: str | Fabric | None = None,
    ) -> Topology:
        """Build from netem strings or specs (None means no impairment).

        A bad spec's error says which argument held it ("nic: netem: unknown keyword ...").
        """
        if isinstance(links, str):
            links = _named("links", parse_links, links)
        if links is not None and not isinstance(links, Mapping):
            raise TypeError(
                f"links must be a dict {{(src_node, dst_node): spec}} or a string "
                f"'SRC->DST=spec; ...', got {links!r}"
            )
        parsed = {}
        for key, spec in (links or {}).items():
            try:
                src, dst = key
                if not all(float(k).is_integer() for k in key):  # 0.5 is no node
                    raise ValueError
                src, dst = int(src), int(dst)
            except (TypeError, ValueError):
                raise ValueError(
                    f"links: key {key!r} must be a (src_node, dst_node) pair"
                ) from None
            parsed[(src, dst)] = _named(f"links[{src}->{dst}]", as_netem, spec) or NO_IMPAIRMENT
        return cls(
            nodes=nodes,
            procs_per_node=procs_per_node,
            nic=_named("nic", as_netem, nic) or NO_IMPAIRMENT,
            intra=_named("intra", as_netem, intra) or NO_IMPAIRMENT,
            links=parsed,
            fabric=_named("fabric", as_fabric, fabric) or CROSSBAR,
        )

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def is_noop(self) -> bool:
        """True when no direction is impaired at all."""
        return (
            self.nic.is_noop
            and self.intra.is_noop
            and all(spec.is_noop for spec in self.links.values())
            and all(spec.is_noop for spec in self.port_specs())
        )

    def port_specs(self) -> list[Netem]:
        """The spec of each of the fabric's ports, by port id (none on a crossbar)."""
        return self.fabric.port_specs(self.nodes, self.procs_per_node, self.nic)

    def paths(self, src, dst, connection=0):
        """Port ids that messages src[i] -> dst[i] cross after the sender's NIC (`fabric.paths`):
        an (m, fabric.MAX_HOPS) int array, -1 past the end of a path."""
        return self.fabric.paths(self.nodes, self.procs_per_node, src, dst, connection)

    def node_of(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")
        return rank // self.procs_per_node

    def nic_of(self, rank: int) -> int:
        """The NIC rank `rank` sends through: its node's (shared), or its own on rails."""
        return rank if self.fabric.nic_per_process() else self.node_of(rank)

    def queue_of(self, src: int, dst: int) -> tuple:
        """The egress queue a message from rank src to rank dst waits in.

        ("nic", n) is NIC n (`nic_of`: node n's shared NIC, or rank n's own on rails);
        ("link", a, b) an overridden direction with its own queue; ("intra", r) rank r's own
        link to the other processes of its node. The fabric's ports come after it
        (`fabric.paths`).
        """
        a, b = self.node_of(src), self.node_of(dst)
        if a == b:
            return ("intra", src)
        if (a, b) in self.links:
            return ("link", a, b)
        return ("nic", self.nic_of(src))

    def spec(self, src: int, dst: int) -> Netem:
        """The impairment that a message from rank src to rank dst experiences."""
        kind, *where = self.queue_of(src, dst)
        if kind == "intra":
            return self.intra
        if kind == "link":
            return self.links[tuple(where)]
        return self.nic

    def scaled(self, k: float) -> Topology:
        """The same topology k times slower (time dilation): delays x k, rates / k."""
        if isinstance(k, bool) or not isinstance(k, numbers.Real) or not 0 < k < math.inf:
            raise ValueError(f"time dilation must be a positive finite number, got {k!r}")
        if k == 1:
            return self
        return Topology(
            nodes=self.nodes,
            procs_per_node=self.procs_per_node,
            nic=self.nic.scaled(k),
            intra=self.intra.scaled(k),
            links={key: spec.scaled(k) for key, spec in self.links.items()},
            fabric=self.fabric.scaled(k),
        )

    def to_env(self) -> dict[str, str]:
        """Environment variables that describe this topology to `Topology.from_env`."""
        return {
            "CLUSTERLAB_NIC": str(self.nic),
            "CLUSTERLAB_INTRA": str(self.intra),
            "CLUSTERLAB_PROCS_PER_NODE": str(self.procs_per_node),
            "CLUSTERLAB_LINKS": "; ".join(f"{a}->{b}={s}" for (a, b), s in self.links.items()),
            "CLUSTERLAB_FABRIC": str(self.fabric),
        }

    @classmethod
    def from_env(cls, world_size: int, environ: Mapping[str, str] | None = None) -> Topology:
        """Read the topology of a `world_size`-rank job from CLUSTERLAB_* variables."""
        env = os.environ if environ is None else environ
        ppn_text = env.get("CLUSTERLAB_PROCS_PER_NODE") or "1"
        try:
            ppn = int(ppn_text)
        except ValueError:
            raise ValueError(
                f"CLUSTERLAB_PROCS_PER_NODE must be an integer, got {ppn_text!r}"
            ) from None
        if ppn < 1 or world_size % ppn:
            raise ValueError(
                f"CLUSTERLAB_PROCS_PER_NODE={ppn} does not divide the world size {world_size}"
            )
        fabric = env.get("CLUSTERLAB_FABRIC") or None
        specs = {"fabric": _named("CLUSTERLAB_FABRIC", as_fabric, fabric)}
        for arg, name in (("nic", "CLUSTERLAB_NIC"), ("intra", "CLUSTERLAB_INTRA"),
                          ("links", "CLUSTERLAB_LINKS")):
            text = env.get(name) or None
            specs[arg] = _named(name, parse_links if arg == "links" else as_netem, text)
        try:
            return cls.build(nodes=world_size // ppn, procs_per_node=ppn, **specs)
        except ValueError as exc:  # an override naming a node that does not exist
            if str(exc).startswith("links"):
                raise ValueError(f"CLUSTERLAB_LINKS: {exc}") from None
            raise


def _named(argument: str, parse, value):
    """parse(value), with the argument's name put in front of its error message."""
    if value is None:
        return None
    try:
        return parse(value)
    except (TypeError, ValueError) as exc:
        if str(exc).startswith(f"{argument}"):
            raise
        raise type(exc)(f"{argument}: {exc}") from None


def parse_links(text: str) -> dict[tuple[int, int], Netem]:
    """Parse "0->1=delay 10ms; 1->0=rate 100mbit" into {(0, 1): Netem, (1, 0): Netem}."""
    out: dict[tuple[int, int], Netem] = {}
    for item in filter(str.strip, text.split(";")):
        match = _LINK_ITEM.match(item)
        if not match:
            raise ValueError(
                f"links: cannot read {item.strip()!r} (expected 'SRC->DST=netem spec')"
            )
        out[(int(match[1]), int(match[2]))] = Netem.parse(match[3])
    return out
