"""A fresh pass over the hostile-input cases of issue 30 ("Nothing silent, second pass") that do
not involve LSTMs: each run as a user runs it (the command line as a subprocess, the API in-process);
prints each case CLEAR or WRONG and the counts tried / clear / wrong.

    python benchmarks/hostile_pass.py

CLEAR: the documented exit status and one error line naming the cause (or, for the eval-mode model,
a warning and a plan whose step, run in training mode, measures within its budget). The model files
are written to a temporary folder. About 5 minutes on 2 loaded cores.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = tempfile.mkdtemp(prefix="hostile-pass-")
MODEL_FILES = {
    'deep.py': """import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(11):
        layers += [nn.Linear(64, 64), nn.Tanh()]
    return nn.Sequential(*layers)

def example_inputs():
    return (torch.randn(32, 64, generator=torch.Generator().manual_seed(0)),)
""",
    'meta.py': """import torch
from torch import nn

def build_model():
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))

def example_inputs():
    return (torch.randn(16, 256),)
""",
    'hfgc.py': """import torch
from transformers import GPT2Config, GPT2LMHeadModel

def build_model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16, use_cache=False)
    model = GPT2LMHeadModel(config)
    model.gradient_checkpointing_enable()
    return model

def example_inputs():
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}

def loss_fn(output):
    return output.loss
""",
    'tiny.py': """import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))

def example_inputs():
    return (torch.randn(64, 16, generator=torch.Generator().manual_seed(0)),)
""",
    'mlp.py': """import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.1)),
                         nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10))

def example_inputs():
    return (torch.randn(512, 32, generator=torch.Generator().manual_seed(0)),)
""",
}
for _name, _text in MODEL_FILES.items():
    with open(os.path.join(HERE, _name), "w") as _file:
        _file.write(_text)
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
results = []


def cli(*args, timeout=300):
    started = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "planner", *args], cwd=HERE, env=ENV, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "TIMEOUT", time.perf_counter() - started
    return r.returncode, r.stdout, r.stderr, time.perf_counter() - started


def errors(stderr):
    return [line for line in stderr.splitlines() if line.startswith("plan-checkpoints: error:")]


def record(name, ok, detail):
    results.append((name, ok))
    print(f"{'CLEAR' if ok else 'WRONG'}  {name}: {detail[:400]}")


def refused(name, args, code, *phrases, seconds=120):
    rc, out, err, took = cli(*args)
    lines = errors(err)
    ok = rc == code and len(lines) == 1 and "Traceback" not in err and all(p in lines[0] for p in phrases) \
        and took < seconds
    record(name, ok, f"exit {rc} in {took:.1f} s: {lines[0] if lines else err[-300:]}")


# 1. the hang: cpsat with an absurd time limit below the model's minimum; inf, and a week + 1 s
for value in ("1e308", "inf", "604801"):
    refused(f"cpsat --time-limit {value}", ["deep.py", "--budget", "200000B", "--solver", "cpsat", "--time-limit", value,
                                             "--out", "p.json"], 2, "is not a time limit", seconds=30)
# 2. below the fixed bytes: every solver at once, exit 3, the least budget as a figure
for solver in ("auto", "regions", "cpsat", "ilp", "dp", "exhaustive"):
    refused(f"below the parameters, --solver {solver}", ["deep.py", "--budget", "100kB", "--solver", solver,
                                                         "--time-limit", "300", "--out", "p.json"], 3, "bytes",
            seconds=60)
# 3. time-out message quotes the user's budget (above the floor, below what cpsat proves in 5 s)
refused("cpsat time-out quotes the budget", ["deep.py", "--budget", "260000B", "--solver", "cpsat", "--time-limit", "5",
                                             "--out", "p.json"], 4, "within budget 260000B", seconds=60)
# 4. meta device
refused("meta-device model", ["meta.py", "--budget", "60%", "--out", "p.json"], 2, "meta device", seconds=60)
# 5. HF gradient checkpointing
refused("HF gradient_checkpointing_enable", ["hfgc.py", "--budget", "60%", "--out", "p.json"], 2,
        "already checkpoints its layers", "gradient_checkpointing_disable", seconds=90)
# 6. --max-batch
refused("--max-batch with a huge budget", ["tiny.py", "--budget", "100GB", "--max-batch", "--out", "p.json"], 2,
        "simply large", seconds=90)
refused("--max-batch --solver regions", ["tiny.py", "--budget", "100%", "--max-batch", "--solver", "regions", "--out",
                                         "p.json"], 2, "traced plans only", seconds=60)
# 7. plan files: native and traced, figures and regions edited, through `show`
rc, _, err, _ = cli("mlp.py", "--budget", "90%", "--out", "native.json", "-q")
assert rc == 0, err
rc, _, err, _ = cli("mlp.py", "--budget", "80%", "--solver", "dp", "--out", "traced.json", "-q")
assert rc == 0, err
native = json.load(open(os.path.join(HERE, "native.json")))
traced = json.load(open(os.path.join(HERE, "traced.json")))
print("native regions:", native["regions"])


def edited(data, **changes):
    out = json.loads(json.dumps(data))
    for key, value in changes.items():
        out[key] = value
    return out


edits = {
    "native peak 1000 B": edited(native, predicted_peak_bytes=1000),
    "native peak 5x budget": edited(native, predicted_peak_bytes=5 * native["budget"]["bytes"]),
    "native measured 5x budget": edited(native, measured_peak_bytes=5 * native["budget"]["bytes"]),
    "native times edited": edited(native, predicted_seconds=0.0, unplanned_seconds=1.0),
    "native duplicate regions": edited(native, regions=native["regions"] * 2),
    "native nested regions": edited(native, regions=[native["regions"][0], native["regions"][0] + ".0"]),
    "traced peak 1000 B": edited(traced, predicted_peak_bytes=1000),
    "traced peak 5x budget": edited(traced, predicted_peak_bytes=5 * traced["budget"]["bytes"]),
    "traced times edited": edited(traced, predicted_seconds=0.0),
}
for name, data in edits.items():
    path = os.path.join(HERE, "edited.json")
    with open(path, "w") as f:
        json.dump(data, f)
    refused(f"show: {name}", ["show", "edited.json"], 2, "edited", seconds=60)

# 8. eval mode through the API: planned as the training step; after model.train() it measures within budget
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
import torch  # noqa: E402
from torch import nn  # noqa: E402

import planner  # noqa: E402
from planner.native_measure import measure_native  # noqa: E402

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.3), nn.Linear(256, 256), nn.GELU(), nn.Dropout(0.3),
                      nn.Linear(256, 256), nn.GELU(), nn.Dropout(0.3), nn.Linear(256, 4))
inputs = (torch.randn(512, 64),)
budget = int(0.8 * planner.plan(model, inputs, "100%").unplanned_peak_bytes)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    made = planner.plan(model.eval(), inputs, budget)
warned = any("eval mode" in str(w.message) for w in caught)
model.train()
measured = measure_native(model, made.regions, inputs, None).peak_bytes
record("plan(model.eval()) then model.train()", warned and measured <= budget and "eval mode" in made.summary(),
       f"warned {warned}, measured {measured} B against a {budget} B budget, regions {made.regions}")

# 9. meta model through the API
with torch.device("meta"):
    meta = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
try:
    planner.plan(meta, (torch.randn(16, 256),), "60%")
    record("API meta-device model", False, "planned")
except planner.SolverError as error:
    record("API meta-device model", "meta device" in str(error), str(error))

tried = len(results)
clear = sum(ok for _, ok in results)
print(f"tried {tried}, clear {clear}, wrong {tried - clear}")
