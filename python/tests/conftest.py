import os
import sys

# The repository's pure-Python reference codec (tests/delta_reference.py).
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests"))
