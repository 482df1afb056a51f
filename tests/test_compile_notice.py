"""Dynamo's "Detected that context_fn is passed to torch.utils.checkpoint under torch.compile" is
not shown for a native plan's own save policies (runtime/compile_notice.py), and still is for a
checkpoint the user wrote with a context_fn. A subprocess: the notice is logged once per process,
to stderr, as a user sees it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import functools, sys, torch
    from torch import nn
    import torch.utils.checkpoint as C
    from runtime.native import apply_native

    torch.manual_seed(0)
    def build():
        return nn.Sequential(nn.Linear(16, 32), nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.1), nn.ReLU()),
                             nn.Linear(32, 1))
    model = apply_native(build(), ["1@matmuls+draws"])
    torch.compile(model, backend="aot_eager")(torch.randn(8, 16)).sum().backward()
    print("== ours done", file=sys.stderr, flush=True)
    torch._logging._internal.warning_once.cache_clear()  # the notice is logged once per process
    inner = build()[1]
    def own(x):
        policy = lambda ctx, op, *a, **k: C.CheckpointPolicy.PREFER_RECOMPUTE
        return C.checkpoint(inner, x, use_reentrant=False,
                            context_fn=functools.partial(C.create_selective_checkpoint_contexts, policy))
    torch.compile(own, backend="aot_eager")(torch.randn(8, 32, requires_grad=True)).sum().backward()
""")


def test_the_context_fn_notice_is_shown_for_the_users_checkpoints_only():
    root = __file__.rsplit("/tests/", 1)[0]
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=root,
                            env={**os.environ, "PYTHONPATH": root})
    assert result.returncode == 0, result.stderr[-2000:]
    ours, _, own = result.stderr.partition("== ours done")
    assert own, result.stderr[-2000:]
    assert "Detected that context_fn" not in ours, ours[-2000:]
    assert "Detected that context_fn" in own, own[-2000:]
