import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Two threads at most: CI machines have two cores, and oversubscribed OpenMP threads make CPU
# timings and some tests far slower than they need to be. One each where pytest-xdist runs two
# workers (pyproject's addopts): two workers of two threads would be four on two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")


@pytest.fixture(autouse=True)
def _seed():
    import random

    random.seed(0)
    torch = sys.modules.get("torch")  # the solver tests never import it: do not pay its import for them
    if torch is not None:
        torch.manual_seed(0)
