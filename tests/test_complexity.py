"""No function of the project's packages is rated E or F by radon's cyclomatic complexity (issue 28
item 5): the code stays in small functions that one can read and test one at a time."""

from pathlib import Path

import pytest

from radon import complexity as radon_complexity

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "profiler", "solvers", "runtime")


def rated_e_or_f(source: str, name: str) -> list[str]:
    """The functions and methods of ``source`` rated E or F (complexity above 30), as ``name (score)``."""
    # cc_visit lists every function and method, and each class (whose figure sums its methods'):
    # the classes are left out, as `radon cc` rates methods, not classes, by the rule asked for.
    functions = [block for block in radon_complexity.cc_visit(source) if not hasattr(block, "methods")]
    return [f"{name}:{function.fullname} ({function.complexity})" for function in functions
            if radon_complexity.cc_rank(function.complexity) in ("E", "F")]


def test_the_check_sees_a_complex_function():
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(40))
    assert rated_e_or_f(f"def f(x):\n{branches}\n    return -1\n", "f.py") == ["f.py:f (41)"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_rated_e_or_f(package):
    sources = sorted((ROOT / package).rglob("*.py"))
    assert sources, f"{package}/ has no Python files: the check would pass vacuously"
    rated = [name for path in sources for name in rated_e_or_f(path.read_text(), str(path.relative_to(ROOT)))]
    assert rated == [], f"rated E or F by radon (split them): {rated}"
