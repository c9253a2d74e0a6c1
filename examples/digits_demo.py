"""The ``dpgraph demo`` as a script: a small CNN trained data-parallel on 8x8 digits.

    python examples/digits_demo.py [--devices 4] [--epochs 6] ...

Same flags as ``dpgraph demo --help``; see ``dpgraph/demo.py`` for the model, which is
written with the Caffe2 API (ModelHelper, brew, data_parallel_model.Parallelize_CPU).
"""

import sys

from dpgraph.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
