"""The native executor's problem solved exactly: which regions of the model to checkpoint with
``torch.utils.checkpoint``, each plain or under a save policy, for the fastest step whose peak fits.

- menu.py: the choices (regions x policies) and which of them overlap;
- peak_rows.py: the peak of any plan as linear rows over the choices, exact at every plan, read off
  the cost model of solvers/regions/;
- chain.py: where the rows make a chain of components (checked on the rows), that chain;
- chain_dp.py: the exact dynamic program over a chain;
- milp.py: the rows in HiGHS, added as incumbents break them (where the rows are no chain);
- method.py: the search (the chain's program, else the MILP from the heuristic of solvers/regions/),
  its status (``optimal`` or the gap) and the ``regions`` method of :func:`solvers.solve`.

Pure Python, networkx, numpy and highspy: no torch, like the rest of ``solvers``.
"""

from .menu import Menu, all_segments, build_menu
from .method import METHOD, RegionSchedule, solve_regions, solve_regions_exact, step_as_it_is
from .peak_rows import PeakRows, build_rows

__all__ = ["METHOD", "Menu", "PeakRows", "RegionSchedule", "all_segments", "build_menu", "build_rows", "solve_regions",
           "solve_regions_exact", "step_as_it_is"]
