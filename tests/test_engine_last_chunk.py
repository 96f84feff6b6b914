"""A call's short last chunk runs in its full chunk's traced graph, padded (issue #42), and
decodes exactly as the eager step at its own shape: the bundled demo model, real audio."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asr_core.audio_io import read_wav
from asr_core.backends import ChunkStepInputs, TorchChunkRunner
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.events import Event, Final, Partial
from asr_core.frontend import compute_fbank
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.stream import StreamConfig, chunk_input_frames
from tests.demo_quality import DEMO_MODEL, SEED_WAV

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "final.pt").is_file(), reason="no bundled demo model")

CHUNK_MS, LEFT_CHUNKS = 320, 4  # the service's default route
CHUNK = 8  # encoder frames of a 320 ms chunk
STRIDE = 32  # fbank frames per chunk


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(DEMO_MODEL)


def recording(last_chunk_frames: int) -> np.ndarray:
    """The seed recording cut so that its last chunk has ``last_chunk_frames`` fbank frames."""
    samples = np.clip(np.rint(read_wav(SEED_WAV).samples), -32768, 32767).astype(np.int16)
    full_chunks = (len(samples) - 400) // 160 // STRIDE - 1
    frames = full_chunks * STRIDE + last_chunk_frames
    return samples[: 400 + (frames - 1) * 160]


def decode(loaded: LoadedModel, traced: bool, recordings: list[np.ndarray]) -> tuple[Engine, list[list[Event]]]:
    """All ``recordings`` as streams of one engine, fed whole and finished at once, so that
    they run in step and their last chunks meet in one tick; the engine and each one's events."""
    engine = Engine(loaded, EngineOptions(max_streams=len(recordings), traced_step=traced, trim_interval_s=0))
    streams = []
    for i, samples in enumerate(recordings):
        events: list[Event] = []
        stream = engine.open_stream(
            StreamConfig(chunk_ms=CHUNK_MS, left_chunks=LEFT_CHUNKS, stream_id=f"s{i}"), events.append
        )
        stream.accept_waveform(samples)
        stream.input_finished()
        streams.append((stream, events))
    for _ in range(10_000):
        if all(stream.done.is_set() for stream, _ in streams):
            break
        engine.run_once()
    return engine, [events for _, events in streams]


def transcript(events: list[Event]) -> list[tuple[object, ...]]:
    """What a listener sees of a stream: partials and finals, their texts and token times."""
    out: list[tuple[object, ...]] = []
    for event in events:
        if isinstance(event, Partial):
            out.append(("partial", event.text, event.tokens, event.token_times_ms, event.begin_ms, event.end_ms))
        elif isinstance(event, Final):
            out.append(("final", event.text, event.tokens, event.token_times_ms, event.reason))
    return out


def eager_steps(engine: Engine) -> int:
    runner = engine.runner
    assert isinstance(runner, TorchChunkRunner)
    return runner.eager_steps


@pytest.mark.parametrize("last_chunk_frames", [12, 20, 34])
def test_a_short_last_chunk_runs_traced_and_decodes_as_the_eager_step(
    loaded: LoadedModel, last_chunk_frames: int
) -> None:
    samples = recording(last_chunk_frames)
    assert last_chunk_frames < chunk_input_frames(CHUNK, loaded.subsampling, loaded.right_context)
    eager, (expected,) = decode(loaded, traced=False, recordings=[samples])
    traced, (got,) = decode(loaded, traced=True, recordings=[samples])
    assert eager_steps(eager) == eager.stats.chunks  # every step eager: the reference
    assert eager_steps(traced) == 0  # the last chunk too ran in the 320 ms graph
    assert transcript(got) == transcript(expected)
    assert any(isinstance(event, Final) for event in got)
    end_ms = len(samples) * 1000 // 16000
    assert all(t <= end_ms for event in got if isinstance(event, Final) for t in event.token_times_ms)


def test_short_last_chunks_of_several_lengths_join_one_batch(loaded: LoadedModel) -> None:
    """Three calls ending in the same tick with last chunks of 12, 20 and 34 fbank frames: the
    eager engine runs three batches for them, one per shape; the padded ones run as one."""
    recordings = [recording(frames) for frames in (12, 20, 34)]
    eager, expected_events = decode(loaded, traced=False, recordings=recordings)
    traced, got_events = decode(loaded, traced=True, recordings=recordings)
    assert eager_steps(traced) == 0
    assert traced.stats.chunks == eager.stats.chunks
    assert eager.stats.batches - traced.stats.batches == 2
    for expected, got in zip(expected_events, got_events, strict=True):
        assert transcript(got) == transcript(expected)


def test_the_padded_step_gives_the_short_steps_frames_and_caches(loaded: LoadedModel) -> None:
    """Runner level: two rows with last chunks of 12 and 20 fbank frames (2 and 4 encoder frames),
    padded to the 320 ms chunk's 35, through its graph: their real frames' outputs, keys and
    values and their conv caches are those of each row's eager step at its own shape, to float
    rounding (the matmuls see other shapes)."""
    full = chunk_input_frames(CHUNK, loaded.subsampling, loaded.right_context)
    window = CHUNK * LEFT_CHUNKS
    traced = TorchChunkRunner(loaded, traced=True)
    traced.expect(full, window)
    eager = TorchChunkRunner(loaded)
    fbank = torch.from_numpy(compute_fbank(recording(full)))[-full:]  # (35, 80) real speech features
    lengths = (12, 20)
    padded = torch.stack([torch.cat([fbank[:n], fbank[n - 1 : n].expand(full - n, -1)]) for n in lengths])
    g = torch.Generator().manual_seed(0)
    offsets = torch.tensor([40, 3])
    cache_pos = offsets.unsqueeze(1) - window + torch.arange(window)  # (2, W) the frames before each chunk
    cache_mask = cache_pos >= 0
    att = torch.randn(loaded.num_blocks, 2, loaded.heads, window, 2 * loaded.d_k, generator=g)
    inputs = ChunkStepInputs(
        xs=padded,
        offsets=offsets,
        att_cache=att * cache_mask[None, :, None, :, None],
        cache_pos=cache_pos.masked_fill(~cache_mask, -1),
        cache_mask=cache_mask,
        cnn_cache=torch.randn(loaded.num_blocks, 2, loaded.d_model, loaded.cnn_cache_frames, generator=g),
        valid_frames=torch.tensor([2, 4]),
    )
    out = traced.step(inputs)
    assert traced.eager_steps == 0 and traced.traced is not None and traced.traced.graphs == 1
    for row, n in enumerate(lengths):
        alone = inputs._replace(
            xs=fbank[None, :n], rows=torch.tensor([row]), valid_frames=None, offsets=offsets[row : row + 1],
            cache_pos=inputs.cache_pos[row : row + 1], cache_mask=cache_mask[row : row + 1],
        )  # fmt: skip
        ref = eager.step(alone)
        frames = ref.ys.size(1)
        assert frames == int(inputs.valid_frames[row])  # type: ignore[index]
        assert_near(out.ys[row : row + 1, :frames], ref.ys)
        assert_near(out.log_probs[row : row + 1, :frames], ref.log_probs)
        assert_near(out.new_kv[:, row : row + 1, :, :frames], ref.new_kv)
        assert_near(out.new_cnn[:, row : row + 1], ref.new_cnn)


def assert_near(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to float rounding (0.0 on the development VM; without the padding mask the demo
    model's log-probs moved by up to 3.5)."""
    torch.testing.assert_close(got, expected, rtol=0.0, atol=1e-4)
