"""``python -m planner ...``: the same command as ``plan-checkpoints ...`` (planner/cli.py)."""

import sys

from planner.cli import main

if __name__ == "__main__":
    sys.exit(main())
