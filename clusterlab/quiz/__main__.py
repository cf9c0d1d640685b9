"""`python -m clusterlab.quiz`: the terminal mode (same options as `clusterlab quiz`)."""

import sys

from .cli import main

sys.exit(main())
