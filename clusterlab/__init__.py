"""clusterlab: an emulated multi-node training cluster on one machine, and a course about it.

`import clusterlab` registers the "netem" torch.distributed backend, so any script can call
`dist.init_process_group("netem")` (configured by CLUSTERLAB_* environment variables), and
`clusterlab.Cluster` starts real ranks from a notebook cell.
"""

from .backend import register as _register_backend
from .backend import traffic
from .clock import elapsed, now
from .cluster import Cluster, ClusterError, ClusterTimeout, RankDied, RankError
from .fabric import Crossbar, Fabric, LeafSpine, RailOptimized
from .netem import Netem
from .topology import Topology

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterTimeout",
    "Crossbar",
    "Fabric",
    "LeafSpine",
    "Netem",
    "RailOptimized",
    "RankDied",
    "RankError",
    "Topology",
    "elapsed",
    "now",
    "traffic",
]
__version__ = "0.1.0"

_register_backend()
