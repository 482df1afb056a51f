"""``python -m planner.cli ...``: the same command as ``plan-checkpoints ...`` (planner/cli/command.py)."""

import sys

from planner.cli.command import main

if __name__ == "__main__":
    sys.exit(main())
