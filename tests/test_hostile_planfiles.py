"""Hostile plan files, second pass (issue 30): a plan's figures are recomputed on load from its own
schedule (traced) or region schedule (native) and checked against the budget; an edited figure,
an edited region or a measurement that is not one is a PlanFileError, never shown as it is. The
native plan is made once per module; `show` runs as a subprocess where the issue names the command.
"""

from __future__ import annotations

import json

import hostile
import pytest
from hostile import EXIT_OK, EXIT_USAGE, assert_refused, cli, write_plan

plan_data = hostile.plan_data


@pytest.fixture(scope="module")
def native_data(tmp_path_factory) -> dict:
    """A measured native plan checkpointing one module of a small MLP with dropout, as its JSON."""
    import torch
    from torch import nn

    import planner

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1),
                          nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.1)),
                          nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10))
    made = planner.plan(model, (torch.randn(512, 32),), "90%")
    assert made.regions and made.measured_peak_bytes is not None, made.regions
    path = tmp_path_factory.mktemp("native") / "plan.json"
    made.save(path)
    return json.loads(path.read_text())


def _load(tmp_path, data):
    import planner

    return planner.load(write_plan(tmp_path / "edited.json", data))


def _edited(data, **changes):
    edited = json.loads(json.dumps(data))
    for key, value in changes.items():
        if key == "budget_bytes":
            edited["budget"]["bytes"] = value
        else:
            edited[key] = value
    return edited


def test_the_saved_plans_load_as_they_are(tmp_path, native_data, plan_data):
    loaded = _load(tmp_path, native_data)
    assert loaded.predicted_peak_bytes == native_data["predicted_peak_bytes"]
    assert list(loaded.regions) == native_data["regions"]
    assert _load(tmp_path, plan_data).predicted_peak_bytes == plan_data["predicted_peak_bytes"]


def _native_edits(data):
    budget, predicted = data["budget"]["bytes"], data["predicted_peak_bytes"]
    region = data["regions"][0]
    return {
        "peak 1000 B": dict(predicted_peak_bytes=1000),
        "peak 5x the budget": dict(predicted_peak_bytes=5 * budget),
        "measured 5x the budget": dict(measured_peak_bytes=5 * budget),
        "measured just over the budget": dict(measured_peak_bytes=budget + 1),
        "measured 1000 B": dict(measured_peak_bytes=1000),
        "measured time 0": dict(measured_seconds=0.0),
        "measured time nan": dict(measured_seconds=float("nan")),
        "predicted time 0": dict(predicted_seconds=0.0),
        "un-checkpointed time 1e9": dict(unplanned_seconds=1e9),
        "un-checkpointed peak 1 B": dict(unplanned_peak_bytes=1),
        "held bytes 0": dict(fixed_bytes=0),
        "budget 1000 B": dict(budget_bytes=1000),
        "budget below the prediction": dict(budget_bytes=predicted // 2),
        "duplicate region": dict(regions=[region, region]),
        "nested region": dict(regions=[region, f"{region}.0"]),
        "overlapping run": dict(regions=[region, "[2:5]"]),
        "another module": dict(regions=["4"]),
        "another policy": dict(regions=[f"{region}@matmuls"]),
        "unknown policy": dict(regions=[f"{region}@magic"]),
        "no region": dict(regions=[]),
        "a module the trace never ran": dict(regions=["nowhere"]),
        "the model itself": dict(regions=[""]),
        "empty run": dict(regions=["[3:3]"]),
    }


def test_every_edit_of_a_native_plan_is_refused(tmp_path, native_data):
    import planner

    for name, change in _native_edits(native_data).items():
        with pytest.raises(planner.PlanFileError, match="edited|not a valid plan|overlap") as refused:
            _load(tmp_path, _edited(native_data, **change))
        assert "\n" not in str(refused.value), name


def test_every_edit_of_a_traced_plans_figures_is_refused(tmp_path, plan_data):
    import planner

    budget = plan_data["budget"]["bytes"]
    for change in [dict(predicted_peak_bytes=1000), dict(predicted_peak_bytes=5 * budget),
                   dict(predicted_seconds=0.0), dict(unplanned_seconds=1e9), dict(unplanned_seconds=0.0),
                   dict(unplanned_peak_bytes=1), dict(fixed_bytes=0), dict(budget_bytes=1000),
                   dict(budget_bytes=budget - 1)]:
        with pytest.raises(planner.PlanFileError, match="the file was edited"):
            _load(tmp_path, _edited(plan_data, **change))


def test_show_refuses_an_edited_peak_in_one_line(tmp_path, native_data):
    """The issue's case: 'Predicted peak: 1000 B ... 99.8% less', exit 0."""
    path = write_plan(tmp_path / "plan.json", _edited(native_data, predicted_peak_bytes=1000))
    result = cli("show", path, cwd=tmp_path)
    assert_refused(result, EXIT_USAGE, "its predicted peak 1000 B", "not what its own schedule simulates to",
                   "the file was edited", seconds=60)
    shown = cli("show", write_plan(tmp_path / "good.json", native_data), cwd=tmp_path)
    assert shown.returncode == EXIT_OK and "Measured peak" in shown.stdout, shown.stderr


# What a fuzzed native plan may load with: the figures loading recomputes are the file's own (else a
# PlanFileError); the measured ones, which cannot be recomputed, are consistent with the rest.
RECOMPUTED = ("predicted_peak_bytes", "fixed_bytes", "regions")
SECONDS = ("predicted_seconds", "unplanned_seconds")
FIELDS = ("predicted_peak_bytes", "predicted_seconds", "unplanned_seconds", "unplanned_peak_bytes", "fixed_bytes",
          "budget_bytes", "measured_peak_bytes", "measured_seconds", "wrapper_bytes")


def test_fuzz_native_plan_files(tmp_path, native_data):
    """Native plans with their regions, policies and figures mutated: each loads with its figures
    recomputed and consistent, or is a PlanFileError; never another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import planner

    region = native_data["regions"][0]
    region_lists = st.sampled_from([
        [region, region], [region, f"{region}.1"], [f"{region}.2", region], ["4"], ["0"], [f"{region}@matmuls"],
        [f"{region}@projections+draws"], [f"{region}@"], [f"{region}@magic"], [], ["[0:3]"], [region, "[0:3]"],
        ["[3:4]"], [region, "6"], ["3.0", "3.1"], [""], [region.upper()], [f" {region}"]])
    factors = st.sampled_from([0, 0.2, 0.5, 0.99, 1.0000001, 1.01, 2, 5, 1000])
    junk = st.sampled_from([None, True, -1, 2**70, 1e30, float("nan"), "12", [], {}])

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.tuples(st.just("regions"), region_lists),
                     st.tuples(st.sampled_from(FIELDS), factors),
                     st.tuples(st.sampled_from(FIELDS), junk)))
    def one(change):
        field, value = change
        data = json.loads(json.dumps(native_data))
        original = data["budget"]["bytes"] if field == "budget_bytes" else data.get(field)
        if field != "regions" and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and isinstance(original, (int, float)) and value in (0, 0.2, 0.5, 0.99, 1.0000001, 1.01, 2, 5, 1000):
            scaled = original * value
            value = type(original)(scaled) if isinstance(original, int) and scaled < 2**60 else scaled
        if field == "budget_bytes":
            data["budget"]["bytes"] = value
        else:
            data[field] = value
        try:
            loaded = _load(tmp_path, data)
        except planner.PlanFileError as error:
            assert "\n" not in str(error)
            return
        for name in RECOMPUTED:
            assert getattr(loaded, name) == (tuple(native_data[name]) if name == "regions" else native_data[name]), \
                (change, name)
        for name in SECONDS:
            assert getattr(loaded, name) == pytest.approx(native_data[name], rel=1e-5), (change, name)
        if loaded.measured_peak_bytes is None:  # the file says it was not measured: then its prediction fits
            assert loaded.predicted_peak_bytes <= loaded.budget_bytes * 1.02, change
        else:
            assert loaded.measured_peak_bytes <= loaded.budget_bytes, change
            assert loaded.predicted_peak_bytes / 2 <= loaded.measured_peak_bytes <= loaded.predicted_peak_bytes * 2
        assert loaded.measured_seconds is None or loaded.measured_seconds > 0, change

    one()


@pytest.mark.parametrize("regions, overlap", [
    (["3", "3"], True), (["3", "3.0"], True), (["[0:3]", "2"], True), (["a@matmuls", "a"], True),
    (["x[1:2]", "x"], True), (["[2:2]"], True), ([""], True), (["a@magic"], True),
    (["[0:3]", "[3:5]"], False), (["h.1", "h.10"], False), (["3"], False), ([], False),
])
def test_regions_do_not_nest_in_one_function(regions, overlap):
    """The one place a nested or duplicate region is refused (compiled plans, and native plans made
    before their graph recorded its regions, rely on it alone)."""
    from planner.planchecks import overlapping_regions

    assert (overlapping_regions(regions) is not None) == overlap, overlapping_regions(regions)
