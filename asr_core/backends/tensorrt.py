"""``backend: tensorrt-fp16`` / ``tensorrt-int8``: TensorRT engines built from the chunk-step ONNX.

The engine is built once per (graph, precision, limits) and cached next to the ONNX file. It
has one optimization profile per batch-size bucket (``PROFILE_BATCHES``), so a batch of 3 and
a batch of 900 each run a kernel selection tuned near their size. INT8 uses an entropy
calibrator fed with realistic chunk-step inputs: WAVs from a directory (e.g. real call
recordings at the customer's site) go through our fbank and the torch streaming path, which
produces the attention and convolution caches a live stream would hold.

Buffers are torch CUDA tensors and the engine runs on torch's current CUDA stream, so no
extra CUDA binding is needed; ``tensorrt`` is imported only here.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import tensorrt as trt
import torch

from asr_core.audio_io import read_wav
from asr_core.backends.onnx_graph import CHUNK_INPUTS, CHUNK_OUTPUTS, cached_chunk_graph, cpu_float_copy
from asr_core.backends.runner import ChunkStep, ChunkStepInputs
from asr_core.frontend import compute_fbank
from asr_core.model.loader import LoadedModel
from asr_core.stream import chunk_input_frames
from kv_ring import KvPool

log = logging.getLogger(__name__)

PROFILE_BATCHES = ((1, 8), (9, 64), (65, 256), (257, 1024))
"""(min, max) batch of each optimization profile; the optimum is tuned at the max."""
DEFAULT_MAX_INPUT_FRAMES = 67
"""Fbank frames of the largest chunk: 640 ms = 16 encoder frames -> (16-1)*4 + 7."""
DEFAULT_MAX_WINDOW = 128
"""Cache frames of the engine's pool by default: 16-frame chunks x 8 left chunks."""
CALIBRATION_DIR_ENV = "ASR_TRT_CALIBRATION_DIR"
"""Directory of WAVs for INT8 calibration when none is passed (e.g. call recordings on site)."""
CALIBRATION_CHUNK = 4
CALIBRATION_LEFT_CHUNKS = 8
CALIBRATION_BATCH = 32
CALIBRATION_MAX_BATCHES = 64

_TORCH_DTYPES = {
    trt.DataType.FLOAT: torch.float32,
    trt.DataType.HALF: torch.float16,
    trt.DataType.INT32: torch.int32,
    trt.DataType.INT64: torch.int64,
    trt.DataType.BOOL: torch.bool,
}


def calibration_inputs(
    loaded: LoadedModel, wav_dir: Path, chunk: int = CALIBRATION_CHUNK, left_chunks: int = CALIBRATION_LEFT_CHUNKS
) -> list[tuple[torch.Tensor, ...]]:
    """Per-chunk inputs (batch 1) of every full chunk of every WAV in ``wav_dir``, streamed with torch.

    Each entry is (xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache) as the engine would
    pass them for one stream with ``chunk`` encoder frames and a window of ``chunk*left_chunks``.
    """
    wavs = sorted(wav_dir.glob("*.wav"))
    if not wavs:
        raise FileNotFoundError(f"{wav_dir}: no .wav files for INT8 calibration (16 kHz mono WAVs expected)")
    loaded = cpu_float_copy(loaded)
    encoder = loaded.model.encoder
    window = chunk * left_chunks
    t_in = chunk_input_frames(chunk, loaded.subsampling, loaded.right_context)
    records: list[tuple[torch.Tensor, ...]] = []
    with torch.inference_mode():
        for wav in wavs:
            fbank = torch.from_numpy(compute_fbank(read_wav(wav).samples))  # (T, n_mels)
            pool = KvPool(1, loaded.cache_geometry(window))
            slot = torch.tensor([pool.allocate(window)])
            offset = 0
            for start, end in encoder.chunk_windows(fbank.size(0), chunk):
                if end - start != t_in:
                    break
                view = pool.gather(slot)
                inputs = (
                    fbank[start:end].unsqueeze(0),
                    torch.tensor([offset]),
                    view.att.clone(),
                    view.pos.clone(),
                    view.mask.clone(),
                    view.cnn.clone(),
                )
                records.append(inputs)
                ys, new_kv, new_cnn = encoder.forward_chunk_batch(*inputs)
                pool.write(slot, new_kv, offset + torch.arange(ys.size(1)).unsqueeze(0), new_cnn)
                offset += ys.size(1)
    return records


class _Calibrator(trt.IInt8EntropyCalibrator2):
    """Feeds batches of recorded chunk-step inputs; the cache file skips recalibration."""

    def __init__(self, records: Sequence[tuple[torch.Tensor, ...]], batch: int, cache_file: Path) -> None:
        super().__init__()
        self.batch = batch
        self.cache_file = cache_file
        self.batches = self._batches(records)
        self.current: list[torch.Tensor] = []

    def _batches(self, records: Sequence[tuple[torch.Tensor, ...]]) -> Iterator[list[torch.Tensor]]:
        order = np.random.default_rng(0).permutation(len(records))
        for first in range(0, min(len(records) // self.batch, CALIBRATION_MAX_BATCHES) * self.batch, self.batch):
            chosen = [records[i] for i in order[first : first + self.batch]]
            yield [
                torch.cat([r[k] for r in chosen], dim=1 if k in (2, 5) else 0).cuda().contiguous()
                for k in range(len(CHUNK_INPUTS))
            ]

    def get_batch_size(self) -> int:
        return self.batch

    def get_batch(self, names: list[str]) -> list[int] | None:
        self.current = next(self.batches, [])
        if not self.current:
            return None
        by_name = dict(zip(CHUNK_INPUTS, self.current, strict=True))
        return [by_name[name].data_ptr() for name in names]

    def read_calibration_cache(self) -> bytes | None:
        return self.cache_file.read_bytes() if self.cache_file.is_file() else None

    def write_calibration_cache(self, cache: bytes) -> None:
        self.cache_file.write_bytes(bytes(cache))


def _shapes(meta: dict[str, int], batch: int, t_in: int, window: int) -> dict[str, tuple[int, ...]]:
    layers, heads, d_k = meta["num_blocks"], meta["heads"], meta["d_k"]
    return {
        "xs": (batch, t_in, meta["n_mels"]),
        "offsets": (batch,),
        "att_cache": (layers, batch, heads, window, 2 * d_k),
        "cache_pos": (batch, window),
        "cache_mask": (batch, window),
        "cnn_cache": (layers, batch, meta["d_model"], meta["cnn_cache_frames"]),
    }


def build_engine(
    onnx_path: Path,
    meta: dict[str, int],
    int8: bool,
    max_input_frames: int = DEFAULT_MAX_INPUT_FRAMES,
    max_window: int = DEFAULT_MAX_WINDOW,
    calibration: Sequence[tuple[torch.Tensor, ...]] = (),
) -> bytes:
    """A serialized TensorRT engine (fp16, plus INT8 when ``int8``) with one profile per bucket."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"{onnx_path}: TensorRT cannot parse the graph: {errors}")
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.FP16)
    min_frames = meta["right_context"] + 1
    for low, high in PROFILE_BATCHES:
        profile = builder.create_optimization_profile()
        smallest = _shapes(meta, low, min_frames, 1)
        optimum = _shapes(meta, high, max_input_frames, max_window)
        for name in CHUNK_INPUTS:
            profile.set_shape(name, smallest[name], optimum[name], optimum[name])
        config.add_optimization_profile(profile)
    if int8:
        if not calibration:
            raise ValueError(
                f"tensorrt-int8 needs calibration data: set {CALIBRATION_DIR_ENV} to a directory of 16 kHz WAVs"
            )
        config.set_flag(trt.BuilderFlag.INT8)
        batch = min(CALIBRATION_BATCH, len(calibration))
        fixed = _shapes(meta, batch, int(calibration[0][0].shape[1]), int(calibration[0][2].shape[3]))
        profile = builder.create_optimization_profile()
        for name in CHUNK_INPUTS:
            profile.set_shape(name, fixed[name], fixed[name], fixed[name])
        config.set_calibration_profile(profile)
        config.int8_calibrator = _Calibrator(calibration, batch, onnx_path.with_suffix(".calibration.cache"))
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"{onnx_path}: TensorRT engine build failed (see the TensorRT log above)")
    return bytes(serialized)


class TensorRTChunkRunner:
    """ChunkRunner on a TensorRT engine; inputs and outputs are CUDA tensors."""

    reads_pool = False  # takes the batch's caches gathered (``ChunkRunner.reads_pool``)
    pads_short_chunks = False  # its graphs take no padding mask: a short chunk runs at its own shape

    def __init__(self, engine_bytes: bytes, meta: dict[str, int]) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("TensorRT backends need a CUDA device; none is visible to torch")
        self.meta = meta
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        self.contexts = [self.engine.create_execution_context() for _ in PROFILE_BATCHES]
        for index, context in enumerate(self.contexts):
            context.set_optimization_profile_async(index, torch.cuda.current_stream().cuda_stream)

    @classmethod
    def for_model(
        cls,
        loaded: LoadedModel,
        int8: bool = False,
        onnx_path: str | Path | None = None,
        cache_dir: Path | None = None,
        calibration_dir: Path | None = None,
    ) -> TensorRTChunkRunner:
        """Build (or load the cached) engine for ``loaded`` from its chunk-step ONNX graph."""
        import onnx

        calibration_dir = calibration_dir or (
            Path(os.environ[CALIBRATION_DIR_ENV]) if os.environ.get(CALIBRATION_DIR_ENV) else None
        )
        graph = Path(onnx_path) if onnx_path is not None else cached_chunk_graph(loaded, False, cache_dir)
        meta = {
            p.key: int(p.value)
            for p in onnx.load(str(graph), load_external_data=False).metadata_props
            if p.value.lstrip("-").isdigit()
        }
        name = f"{'int8' if int8 else 'fp16'}-{trt.__version__}-{torch.cuda.get_device_name().replace(' ', '_')}"
        if int8 and calibration_dir is not None:
            name += "-" + hashlib.sha256(str(sorted(Path(calibration_dir).glob("*.wav"))).encode()).hexdigest()[:12]
        plan = graph.with_name(f"{graph.stem}.{name}.plan")
        if not plan.is_file():
            records = calibration_inputs(loaded, Path(calibration_dir)) if int8 and calibration_dir else []
            log.info("building TensorRT %s engine %s (minutes on first use)", "int8" if int8 else "fp16", plan)
            plan.write_bytes(build_engine(graph, meta, int8, calibration=records))
        return cls(plan.read_bytes(), meta)

    def _context(self, batch: int) -> tuple[int, trt.IExecutionContext]:
        for index, (low, high) in enumerate(PROFILE_BATCHES):
            if low <= batch <= high:
                return index, self.contexts[index]
        raise ValueError(f"batch {batch} exceeds the largest TensorRT profile ({PROFILE_BATCHES[-1][1]})")

    def expect(self, input_frames: int, window: int) -> None:
        """Nothing to prepare: the optimization profiles cover every batch and chunk shape."""

    def close(self) -> None:
        """Nothing to release: the engine and its contexts live as long as the runner."""

    def step(self, inputs: ChunkStepInputs) -> ChunkStep:
        """Shapes in ``ChunkStepInputs``; all inputs on the CUDA device."""
        xs = inputs.xs
        batch = xs.size(0)
        _, context = self._context(batch)
        outputs: dict[str, torch.Tensor] = {}
        keep: list[torch.Tensor] = []
        for name, value in zip(CHUNK_INPUTS, inputs.graph_inputs(), strict=True):
            wanted = _TORCH_DTYPES[self.engine.get_tensor_dtype(name)]
            tensor = value.to(dtype=wanted).contiguous()
            keep.append(tensor)
            context.set_input_shape(name, tuple(tensor.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        for name in CHUNK_OUTPUTS:
            shape = tuple(context.get_tensor_shape(name))
            dtype = _TORCH_DTYPES[self.engine.get_tensor_dtype(name)]
            outputs[name] = torch.empty(shape, dtype=dtype, device=xs.device)
            context.set_tensor_address(name, outputs[name].data_ptr())
        if not context.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise RuntimeError("TensorRT execution failed (see the TensorRT log)")
        return ChunkStep(
            outputs["ys"].to(xs.dtype),
            outputs["log_probs"].float(),
            outputs["new_kv"].to(inputs.att_cache.dtype),
            outputs["new_cnn"].to(inputs.cnn_cache.dtype),
        )
