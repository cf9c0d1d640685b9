"""Interactive explorers for the course (JupyterLab 4, ipywidgets 8).

* `ThroughputExplorer` / `throughput_explorer(**defaults)`: throughput and scaling
  efficiency against node count, closed form vs. simulator vs. a real run on this machine;
* `LinkExplorer` / `link_explorer(spec)`: one netem link's one-way delays, sampled from the
  link model against the configured distribution, optionally measured on two real ranks;
* `RingStepper` / `ring_stepper(p, slow_link)`: a ring all-reduce round by round, and where
  its time goes when one link is slow.

Every explorer has `.show()`: widgets in a front-end, a static Figure elsewhere (a terminal,
nbval; force it with CLUSTERLAB_STATIC=1). Callbacks are plain methods, so they run headless.
"""

from ..netem import netem_string
from ._common import frontend_available
from .link_delays import LinkExplorer, link_explorer
from .ring import RingStepper, ring_stepper
from .throughput import ThroughputExplorer, throughput_explorer

__all__ = [
    "LinkExplorer",
    "RingStepper",
    "ThroughputExplorer",
    "frontend_available",
    "link_explorer",
    "netem_string",
    "ring_stepper",
    "throughput_explorer",
]
