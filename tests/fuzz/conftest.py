"""The fuzz targets live next to the tests (shared with bench/fuzz.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
