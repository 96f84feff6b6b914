"""Hotwords through the batched engine: streams with different phrase lists (and none) share
one finals batch, and each final equals that stream decoded alone with its own list."""

from __future__ import annotations

import numpy as np
import torch

from asr_core.context_graph import ContextGraph
from asr_core.ctc_search import ctc_prefix_beam_search
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.frontend import compute_fbank
from asr_core.model.loader import LoadedModel
from asr_core.offline import encode_streaming
from asr_core.stream import StreamConfig
from rescoring.attention import attention_rescore
from tests.test_engine import NO_ENDPOINTS, Collector, audio, drain, loaded, pytestmark

__all__ = ["audio", "loaded", "pytestmark"]  # fixtures and the skip mark, re-used


def alone(loaded: LoadedModel, samples: np.ndarray, context: ContextGraph | None) -> tuple[tuple[int, ...], list]:
    """(rescoring winner, CTC n-best) of one stream decoded alone (320 ms chunks, 4 left)."""
    encoder_out, _ = encode_streaming(loaded, torch.from_numpy(compute_fbank(samples)), 8, 4)
    log_probs = loaded.model.ctc_log_probs(encoder_out.unsqueeze(0))[0]
    nbest = ctc_prefix_beam_search(log_probs, beam=10, context=context)
    bonuses = [[h.context_score for h in nbest]] if context is not None else None
    (result,) = attention_rescore(
        loaded.model.decoder, [encoder_out], [nbest], sos=loaded.sos_id, eos=loaded.eos_id,
        ctc_weight=0.5, reverse_weight=0.3, bonuses=bonuses,
    )  # fmt: skip
    return result.tokens, nbest


def test_streams_with_different_lists_batch_together(loaded: LoadedModel, audio: list[np.ndarray]) -> None:
    plain = [alone(loaded, samples, None) for samples in audio]
    # Each list boosts the CTC runner-up of one utterance.
    lists = [ContextGraph([(nbest[1].tokens, 3.0)]) for _, nbest in plain]
    plans = [(audio[0], lists[0]), (audio[1], lists[1]), (audio[0], None), (audio[1], lists[0])]
    engine = Engine(loaded, EngineOptions(max_streams=4, max_batch=4, endpoint=NO_ENDPOINTS))
    collector = Collector()
    streams = []
    for i, (samples, graph) in enumerate(plans):
        config = StreamConfig(chunk_ms=320, left_chunks=4, stream_id=f"s{i}", context=graph)
        stream = engine.open_stream(config, collector)
        stream.accept_waveform(samples)
        stream.input_finished()
        streams.append(stream)
    drain(engine, streams)
    for i, (samples, graph) in enumerate(plans):
        (final,) = collector.finals(f"s{i}")
        best, nbest = alone(loaded, samples, graph)
        assert final.tokens == best, f"stream {i}"
        assert sorted(e.tokens for e in final.nbest) == sorted(h.tokens for h in nbest)
    phrase = plain[0][1][1].tokens
    boosted = alone(loaded, audio[0], lists[0])[1]
    # The n-best is led by a hypothesis holding the whole phrase (the runner-up, or it extended).
    assert boosted[0].tokens[: len(phrase)] == phrase
    assert boosted[0].context_score == 3.0 * len(phrase)
