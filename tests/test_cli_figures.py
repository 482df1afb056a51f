"""The command line's figures for native plans (issue 29): a budget below the parameters, buffers
and inputs names the least budget as a figure; ``--json``'s ``recomputed_nodes`` counts the ops the
message says are recomputed. Through a subprocess, as a user runs it."""

from __future__ import annotations

import json
import re

from test_cli import assert_clean_error, model_file, run


def test_a_budget_below_the_fixed_bytes_names_the_least_budget_and_it_plans(tmp_path):
    out = tmp_path / "plan.json"
    result = run(model_file(tmp_path), "--budget", "1KB", "--out", out)
    assert_clean_error(result, 3, "below the least that checkpointing the model's modules reaches: ")
    least = re.search(r"\((\d+) bytes[;)]", result.stderr)
    assert least, result.stderr
    assert not out.exists()
    again = run(model_file(tmp_path), "--budget", least.group(1), "--out", out, "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["predicted_peak_bytes"] <= int(least.group(1))
    # The same run's message and count agree: "recomputing N op(s)" is recomputed_nodes.
    said = re.search(r"recomputing (\d+) op", summary["message"])
    assert said and int(said.group(1)) == summary["recomputed_nodes"] > 0, summary
