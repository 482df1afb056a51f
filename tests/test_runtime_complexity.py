"""No function in runtime/ is rated E or F by radon's cyclomatic complexity (issue 28 item 5):
the executor's code stays in small functions that one can read and test one at a time."""

from pathlib import Path

import pytest

radon_complexity = pytest.importorskip("radon.complexity")

RUNTIME = Path(__file__).resolve().parent.parent / "runtime"


def _rated_e_or_f(path: Path) -> list[str]:
    """The functions and methods of ``path`` rated E or F (complexity above 30), as ``name (score)``."""
    # cc_visit lists every function and method, and each class (whose figure sums its methods'):
    # the classes are left out, as `radon cc` rates methods, not classes, by the rule asked for.
    functions = [block for block in radon_complexity.cc_visit(path.read_text()) if not hasattr(block, "methods")]
    return [f"{path.name}:{function.fullname} ({function.complexity})" for function in functions
            if radon_complexity.cc_rank(function.complexity) in ("E", "F")]


def test_no_function_in_runtime_is_rated_e_or_f():
    sources = sorted(RUNTIME.rglob("*.py"))
    assert sources, "runtime/ has no Python files: the check would pass vacuously"
    rated = [name for path in sources for name in _rated_e_or_f(path)]
    assert rated == [], f"rated E or F by radon (split them): {rated}"
