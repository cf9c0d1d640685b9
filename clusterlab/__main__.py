"""`python -m clusterlab ...` is the `clusterlab` command."""

import sys

from .cli import main

sys.exit(main())
