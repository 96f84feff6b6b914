"""Traced chunk steps (asr_core/backends/traced.py): the same outputs as the eager step, one
graph per declared shape, and the eager step wherever a graph does not apply."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from asr_core.backends import SPLIT_MIN_STREAMS, ChunkStepInputs, TorchChunkRunner, make_runner
from asr_core.backends.traced import POSITION_LIMIT
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.stream import chunk_input_frames

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"WeNet fixture not found at {FIXTURE}")

CHUNK = 4  # encoder frames (160 ms)
WINDOW = 32  # cache frames


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(FIXTURE / "model")


def input_frames(loaded: LoadedModel, chunk: int = CHUNK) -> int:
    return chunk_input_frames(chunk, loaded.subsampling, loaded.right_context)


def step_inputs(loaded: LoadedModel, batch: int, seed: int, first_offset: int = 0) -> ChunkStepInputs:
    """B streams at different points of their utterances: some caches partly empty, as in the engine."""
    g = torch.Generator().manual_seed(seed)
    offsets = first_offset + torch.randint(0, 200, (batch,), generator=g)
    offsets[0] = first_offset  # a stream at the start of its utterance: nothing cached yet
    ring = torch.arange(WINDOW)
    newest = offsets.unsqueeze(1) - 1
    cache_pos = newest - (newest - ring) % WINDOW  # the frame at each ring index
    cache_mask = cache_pos >= 0
    cache_pos = cache_pos.masked_fill(~cache_mask, -1)
    att = torch.randn(loaded.num_blocks, batch, loaded.heads, WINDOW, 2 * loaded.d_k, generator=g)
    return ChunkStepInputs(
        xs=10.0 + 3.0 * torch.randn(batch, input_frames(loaded), 80, generator=g),
        offsets=offsets,
        att_cache=att * cache_mask[None, :, None, :, None],  # the pool holds zeros where never written
        cache_pos=cache_pos,
        cache_mask=cache_mask,
        cnn_cache=torch.randn(loaded.num_blocks, batch, loaded.d_model, loaded.cnn_cache_frames, generator=g),
    )


def assert_same_step(a: object, b: object) -> None:
    for name in ("ys", "log_probs", "new_kv", "new_cnn"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        assert torch.equal(x, y), f"{name}: max difference {float((x - y).abs().max())}"


@pytest.mark.parametrize("backend", ["torch", "torch-int8"])
def test_traced_step_equals_the_eager_step_for_any_batch(loaded: LoadedModel, backend: str) -> None:
    traced = make_runner(backend, loaded, traced=True)
    eager = make_runner(backend, loaded)
    assert isinstance(traced, TorchChunkRunner) and traced.traced is not None
    assert isinstance(eager, TorchChunkRunner) and eager.traced is None
    traced.expect(input_frames(loaded), WINDOW)
    for seed, batch in enumerate((3, 1, 7, 3)):
        inputs = step_inputs(loaded, batch, seed)
        assert_same_step(traced.step(inputs), eager.step(inputs))
    assert traced.traced.graphs == 1  # the batch size is free within a graph


def test_other_shapes_and_late_positions_run_eagerly(loaded: LoadedModel) -> None:
    traced = make_runner("torch-int8", loaded, traced=True)
    eager = make_runner("torch-int8", loaded)
    assert isinstance(traced, TorchChunkRunner) and traced.traced is not None
    traced.expect(input_frames(loaded), WINDOW)
    # A short last chunk: a shape nobody declared; traced on first use it would stall the engine.
    short = step_inputs(loaded, 2, seed=1)
    short = short._replace(xs=short.xs[:, : input_frames(loaded) - 5])
    assert_same_step(traced.step(short), eager.step(short))
    assert traced.traced.graphs == 0
    # Positions past the graphs' table (an utterance longer than it covers) need the eager path.
    late = step_inputs(loaded, 2, seed=2, first_offset=POSITION_LIMIT)
    assert_same_step(traced.step(late), eager.step(late))
    assert traced.traced.graphs == 0
    assert_same_step(traced.step(step_inputs(loaded, 2, seed=3)), eager.step(step_inputs(loaded, 2, seed=3)))
    assert traced.traced.graphs == 1


def in_a_pool(inputs: ChunkStepInputs, slots: int, seed: int) -> ChunkStepInputs:
    """The same step with its caches as ``rows`` of a larger pool (the other rows: other
    streams' values), in no particular order."""
    g = torch.Generator().manual_seed(seed)
    batch = inputs.xs.size(0)
    rows = torch.randperm(slots, generator=g)[:batch]

    def pooled(cache: torch.Tensor) -> torch.Tensor:
        pool = torch.randn((cache.size(0), slots, *cache.shape[2:]), generator=g)
        pool[:, rows] = cache
        return pool

    return inputs._replace(att_cache=pooled(inputs.att_cache), cnn_cache=pooled(inputs.cnn_cache), rows=rows)


@pytest.mark.parametrize("backend", ["torch", "torch-int8"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_a_step_on_rows_of_the_pool_equals_the_step_on_gathered_caches(
    loaded: LoadedModel, backend: str, traced: bool
) -> None:
    """``rows``: the step reads each layer's rows of the pool where they lie (what the engine
    passes since the torch runners ``reads_pool``); every output equals the gathered step's."""
    runner = make_runner(backend, loaded, traced=traced)
    assert runner.reads_pool
    runner.expect(input_frames(loaded), WINDOW)
    for seed, batch in enumerate((5, 1, 3)):
        inputs = step_inputs(loaded, batch, seed)
        pooled = in_a_pool(inputs, slots=11, seed=seed)
        reference = runner.step(inputs)
        assert_same_step(runner.step(pooled), reference)
    if traced:
        assert isinstance(runner, TorchChunkRunner) and runner.traced is not None
        assert runner.traced.graphs == 1  # one graph whatever the pool's size and the rows


def test_a_step_on_rows_of_a_pool_that_may_hold_anything(loaded: LoadedModel) -> None:
    """Without ``cache_is_finite`` (WeNet's layout, any backend's pool) the rows are gathered
    first and their invalid frames zeroed: NaN in another stream's rows or in a masked frame
    changes nothing."""
    encoder = loaded.model.encoder.eval()
    inputs = step_inputs(loaded, 3, seed=9)
    inputs.att_cache[:, 0] = float("nan")  # stream 0 has nothing cached: all masked
    pooled = in_a_pool(inputs, slots=6, seed=9)
    rows = pooled.rows
    assert rows is not None
    others = torch.ones(6, dtype=torch.bool)
    others[rows] = False
    pooled.att_cache[:, others] = float("nan")
    with torch.inference_mode():
        want = encoder.forward_chunk_batch(*inputs.graph_inputs())
        got = encoder.forward_chunk_batch(
            pooled.xs,
            pooled.offsets,
            pooled.att_cache,
            pooled.cache_pos,
            pooled.cache_mask,
            pooled.cnn_cache,
            cache_rows=rows,
        )
    for x, y in zip(got, want, strict=True):
        assert not torch.isnan(x).any()
        assert torch.equal(x, y)


def test_a_large_batch_split_over_threads_keeps_each_streams_outputs(loaded: LoadedModel) -> None:
    """step_threads: a large batch runs as parts in parallel threads; every stream gets the
    outputs the whole batch gives it, in its own row."""
    split = make_runner("torch", loaded, traced=True, step_threads=3)
    whole = make_runner("torch", loaded, traced=True)
    assert isinstance(split, TorchChunkRunner) and isinstance(whole, TorchChunkRunner)
    for runner in (split, whole):
        runner.expect(input_frames(loaded), WINDOW)
    inputs = step_inputs(loaded, 3 * SPLIT_MIN_STREAMS + 2, seed=5)
    split.step(inputs)  # builds the graph in one thread first: not split
    assert split._helpers is None
    out = split.step(inputs)
    assert split._helpers is not None  # this time it was
    reference = whole.step(inputs)
    pooled = in_a_pool(inputs, slots=3 * SPLIT_MIN_STREAMS + 9, seed=5)
    for got in (out, split.step(pooled)):  # each part reads its own rows of the pool
        for name in ("ys", "log_probs", "new_kv", "new_cnn"):
            x, y = getattr(got, name), getattr(reference, name)
            assert x.shape == y.shape, name
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4, msg=name)
    # Too few streams for two parts: one piece, as without helpers.
    small = step_inputs(loaded, 2 * SPLIT_MIN_STREAMS - 1, seed=6)
    assert_same_step(split.step(small), whole.step(small))
    split.close()
    assert split._helpers is None
    with pytest.raises(ValueError, match="step_threads"):
        TorchChunkRunner(loaded, traced=True, step_threads=0)


def test_a_step_the_tracer_cannot_follow_runs_eagerly(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """If tracing fails (a model the tracer cannot follow, a torch without torch.jit) the step
    still runs, eagerly, and the failure is logged once rather than retried every batch."""
    calls = []

    def broken_trace(*args: object, **kwargs: object) -> None:
        calls.append(1)
        raise RuntimeError("tracer says no")

    monkeypatch.setattr(torch.jit, "trace", broken_trace)
    traced = make_runner("torch", loaded, traced=True)
    eager = make_runner("torch", loaded)
    assert isinstance(traced, TorchChunkRunner) and traced.traced is not None
    traced.expect(input_frames(loaded), WINDOW)
    with caplog.at_level(logging.ERROR, logger="asr_core.backends.traced"):
        for seed in range(3):
            inputs = step_inputs(loaded, 2, seed)
            assert_same_step(traced.step(inputs), eager.step(inputs))
    assert len(calls) == 1 and traced.traced.graphs == 0
    assert "runs eagerly" in caplog.text


def test_engine_warm_up_traces_every_allowed_chunk_size(loaded: LoadedModel) -> None:
    options = EngineOptions(max_streams=2, allowed_chunk_ms=(160, 320), backend="torch-int8")
    engine = Engine(loaded, options)
    assert isinstance(engine.runner, TorchChunkRunner) and engine.runner.traced is not None
    assert engine.runner.traced.graphs == 0
    assert engine.warm_up() > 0
    assert engine.runner.traced.graphs == 2
    eager = Engine(loaded, EngineOptions(max_streams=2, traced_step=False))
    assert isinstance(eager.runner, TorchChunkRunner) and eager.runner.traced is None


def test_only_runners_with_graphs_take_padded_short_chunks(loaded: LoadedModel) -> None:
    """The torch runner takes a short last chunk padded to its full shape where it has graphs;
    the exported graphs' inputs have no place for the padding mask, so they refuse it."""
    assert make_runner("torch", loaded, traced=True).pads_short_chunks
    assert not make_runner("torch", loaded).pads_short_chunks
    padded = step_inputs(loaded, 2, seed=5)._replace(valid_frames=torch.tensor([2, CHUNK]))
    with pytest.raises(ValueError, match="valid_frames"):
        padded.graph_inputs()
