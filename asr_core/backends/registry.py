"""The backend registry: backend names, and ``make_runner``, which builds the chosen one.

Optional backends (ONNX Runtime, TensorRT, CUDA graphs) are imported only when chosen, so
their packages stay optional; a missing one is reported with the extra that installs it.
"""

from __future__ import annotations

from pathlib import Path

from asr_core.backends.runner import ChunkRunner
from asr_core.backends.torch_runner import TorchChunkRunner
from asr_core.model.loader import LoadedModel

BACKENDS = (
    "torch",
    "torch-int8",
    "torch-cudagraph",
    "onnxruntime",
    "onnxruntime-int8",
    "tensorrt",
    "tensorrt-fp16",
    "tensorrt-int8",
)
"""Names ``make_runner`` accepts; ``tensorrt`` means ``tensorrt-fp16``."""

EXTRA_FOR_MODULE = {"onnx": "onnx", "onnxruntime": "onnx", "tensorrt": "gpu", "cuda": "gpu"}
"""Optional top-level package -> the hotline-asr extra that installs it."""


def make_runner(
    backend: str,
    loaded: LoadedModel,
    *,
    onnx_path: str | Path | None = None,
    cache_dir: Path | None = None,
    threads: int | None = None,
    calibration_dir: Path | None = None,
    traced: bool = False,
    step_threads: int = 1,
) -> ChunkRunner:
    """The chunk runner for ``backend`` (one of ``BACKENDS``) on the device ``loaded`` is on.

    ONNX and TensorRT backends run the graph at ``onnx_path``, or export ``loaded`` on first use
    into ``cache_dir`` (default ``$ASR_ONNX_CACHE`` or ``$XDG_CACHE_HOME/hotline-asr/onnx``).
    ``threads``: ONNX Runtime intra-op threads (default: torch's). ``calibration_dir``: WAVs
    for the TensorRT INT8 calibrator. ``traced``: the torch backends on a CPU run the shapes
    declared with ``expect`` as frozen TorchScript graphs (``asr_core.backends.traced``), with
    large batches split over ``step_threads`` threads (``TorchChunkRunner``).
    Optional packages are imported only here, when chosen.
    """
    if backend in ("torch", "torch-int8"):
        return TorchChunkRunner(loaded, int8=backend == "torch-int8", traced=traced, step_threads=step_threads)
    if backend not in BACKENDS:
        raise ValueError(f"engine backend {backend!r} is not available; choose one of: {', '.join(BACKENDS)}")
    try:
        if backend == "torch-cudagraph":
            from asr_core.backends.cudagraph import CudaGraphChunkRunner

            return CudaGraphChunkRunner(loaded)
        if backend.startswith("onnxruntime"):
            from asr_core.backends.onnxruntime import OrtChunkRunner

            return OrtChunkRunner.for_model(
                loaded, int8=backend.endswith("int8"), path=onnx_path, cache_dir=cache_dir, threads=threads
            )
        from asr_core.backends.tensorrt import TensorRTChunkRunner

        return TensorRTChunkRunner.for_model(
            loaded,
            int8=backend.endswith("int8"),
            onnx_path=onnx_path,
            cache_dir=cache_dir,
            calibration_dir=calibration_dir,
        )
    except ModuleNotFoundError as exc:
        package = (exc.name or "").split(".")[0]
        if package not in EXTRA_FOR_MODULE:
            raise
        raise RuntimeError(
            f"engine backend {backend!r} needs the Python package {package!r}, which is not installed; "
            f"install the extra: pip install 'hotline-asr[{EXTRA_FOR_MODULE[package]}]'"
        ) from exc
