"""When modules may cache tensors derived from their weights (projected position tables,
fused projection weights): eval mode, no autograd, and not while tracing/exporting/compiling
(a cached tensor would be baked into the graph as a constant and carry no gradient)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import Tensor, nn

_serving = threading.local()


@contextlib.contextmanager
def serving_trace() -> Iterator[None]:
    """Trace, in this thread, a graph for this process's own use (``backends.traced``), not
    for export: the eager fast paths and weight-derived caches stay on, and whatever they
    cache is frozen into the graph as constants, as eager mode would use it."""
    previous = getattr(_serving, "active", False)
    _serving.active = True
    try:
        yield
    finally:
        _serving.active = previous


def exporting() -> bool:
    """True while tracing, scripting, exporting to ONNX or compiling (but not inside
    ``serving_trace``)."""
    if getattr(_serving, "active", False):
        return False
    return (
        torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or torch.onnx.is_in_onnx_export()
        or torch.compiler.is_compiling()
    )


def may_cache_derived(module: nn.Module) -> bool:
    """Whether ``module`` may serve weight-derived tensors from a cache right now."""
    return not (module.training or torch.is_grad_enabled() or exporting())


def weights_key(*tensors: Tensor | None) -> tuple[object, ...]:
    """Identity and version of ``tensors``: changes when any of them is replaced or edited
    in place (``load_state_dict``, ``.to()``, ``mul_`` ...), which invalidates a cache."""
    return tuple(None if t is None else (t.data_ptr(), t._version, t.dtype, t.device, tuple(t.shape)) for t in tensors)
