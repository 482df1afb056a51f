"""Device memory a training step needs beyond its tensors: the workspaces CUDA libraries keep.

cuBLAS keeps a workspace per handle, and PyTorch gives each thread that issues a matrix product a
handle of its own: the caller's thread runs the forward's, autograd's device thread the backward's.
PyTorch allocates these workspaces from its caching allocator the first time a thread multiplies
(so ``torch.cuda.max_memory_allocated`` counts them, and ``set_per_process_memory_fraction`` caps
them) and keeps them until ``torch._C._cuda_clearCublasWorkspaces()``. They are held for the whole
training run, like the parameters: the cost graph counts them in its ``fixed_bytes``
(profiler/api.py) and :func:`profiler.memory.measure_step` in what the step holds throughout.

Measured on an H200 (torch 2.11.0+cu130): 33 MiB after one linear layer's forward, 65 MiB after its
backward. Left out, a GPT-2's traced plan predicted 1557.3 MiB measured 1623.2 MiB of tensors (plus
the allocator's rounding) in a fresh process, 66 MiB above (docs/benchmarks/cuda-bounded.md); the
planner's own measurement had missed them too, since its warm-up step allocated them before the
measured step began. On CPU there are none.
"""

from __future__ import annotations

import torch
from torch import fx

# Ops whose CUDA kernels are cuBLAS's (or cuBLASLt's, which shares the workspace): matrix products.
CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear",
                        "_addmm_activation", "_scaled_mm", "_int_mm"})


def uses_cublas(graph_module: fx.GraphModule) -> bool:
    """Whether the traced step runs any op that cuBLAS computes on CUDA (:data:`CUBLAS_OPS`)."""
    for node in graph_module.graph.nodes:
        packet = getattr(node.target, "overloadpacket", None) if node.op == "call_function" else None
        if packet is not None and packet.__name__ in CUBLAS_OPS:
            return True
    return False


def clear_cublas_workspaces() -> None:
    """Free cuBLAS's workspaces (the next product on each thread allocates its own again): a step
    measured after this allocates them as a training run's first step does."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None and torch.cuda.is_available():
        clear()


def cublas_workspace_bytes(device: torch.device | str) -> int:
    """Bytes of the cuBLAS workspaces a training step keeps on ``device`` (0 on a CPU): measured, the
    workspaces freed, then a small linear layer's forward on this thread and its backward on
    autograd's device thread, as the growth of ``torch.cuda.memory_allocated``. The size depends on
    the GPU, the CUDA version and ``CUBLAS_WORKSPACE_CONFIG``, hence measured, not read from them."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    with torch.cuda.device(device):
        layer = torch.nn.Linear(16, 16, device=device)
        inputs = torch.randn(4, 16, device=device, requires_grad=True)
        torch.cuda.synchronize(device)
        clear_cublas_workspaces()
        before = torch.cuda.memory_allocated(device)
        layer(inputs).sum().backward()
        inputs.grad = None
        layer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.memory_allocated(device) - before)


def step_library_bytes(graph_module: fx.GraphModule, device: torch.device | str) -> int:
    """Bytes the libraries keep on ``device`` for the traced step ``graph_module``: cuBLAS's
    workspaces where the step multiplies matrices, else none."""
    return cublas_workspace_bytes(device) if uses_cublas(graph_module) else 0


__all__ = ["CUBLAS_OPS", "clear_cublas_workspaces", "cublas_workspace_bytes", "step_library_bytes", "uses_cublas"]
