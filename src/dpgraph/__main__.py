"""``python -m dpgraph``: the dpgraph command line."""

import sys

from dpgraph.cli import main

sys.exit(main())
