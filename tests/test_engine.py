"""The shared engine: batched multi-stream decoding equals each stream decoded alone.

Uses WeNet's fixture model (random weights, peaky CTC) so that token sequences are long and
varied; references come from the single-stream chunked path (``encode_streaming``) with the
same searches ``asr-transcribe`` runs.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from asr_common.errors import CapacityError
from asr_common.scoring import edit_distance
from asr_core.audio_io import read_wav
from asr_core.ctc_search import ctc_greedy_batch, ctc_prefix_beam_search
from asr_core.endpoint import EndpointRules
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions, resolve_dtype
from asr_core.events import Ended, Event, Final, Partial
from asr_core.frontend import compute_fbank
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.offline import encode_streaming
from asr_core.stream import StreamConfig
from rescoring.attention import attention_rescore

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"WeNet fixture not found at {FIXTURE}")

NO_ENDPOINTS = EndpointRules(trailing_silence_ms=10**9, leading_silence_ms=10**9, max_utterance_ms=10**9)


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(FIXTURE / "model")


@pytest.fixture(scope="module")
def audio() -> list[np.ndarray]:
    return [read_wav(FIXTURE / "wav" / name).samples for name in ("utt1.wav", "utt2.wav")]


@dataclass
class Collector:
    events: dict[str, list[Event]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, event: Event) -> None:
        with self.lock:
            self.events.setdefault(event.stream_id, []).append(event)

    def finals(self, stream_id: str) -> list[Final]:
        return [e for e in self.events.get(stream_id, []) if isinstance(e, Final)]

    def partials(self, stream_id: str) -> list[Partial]:
        return [e for e in self.events.get(stream_id, []) if isinstance(e, Partial)]


@dataclass(frozen=True)
class Reference:
    greedy: list[int]
    best: tuple[int, ...]
    score: float
    nbest: list[tuple[int, ...]]


def reference(loaded: LoadedModel, samples: np.ndarray, chunk_ms: int, left_chunks: int) -> Reference:
    """What one stream alone gives: chunked encoder, greedy, prefix beam search, rescoring."""
    fbank = torch.from_numpy(compute_fbank(samples))
    encoder_out, _ = encode_streaming(loaded, fbank, chunk_ms // 40, left_chunks)
    log_probs = loaded.model.ctc_log_probs(encoder_out.unsqueeze(0))  # (1, T, V)
    greedy = ctc_greedy_batch(log_probs, torch.tensor([encoder_out.shape[0]]))[0]
    nbest = ctc_prefix_beam_search(log_probs[0], beam=10)
    (result,) = attention_rescore(
        loaded.model.decoder,
        [encoder_out],
        [nbest],
        sos=loaded.sos_id,
        eos=loaded.eos_id,
        ctc_weight=0.5,
        reverse_weight=0.3,
    )
    return Reference(greedy, result.tokens, result.score, [h.tokens for h in nbest])


def drain(engine: Engine, streams: list) -> None:
    for _ in range(100_000):
        if all(s.done.is_set() for s in streams):
            return
        engine.run_once()
    raise AssertionError("engine did not finish the streams")


def test_many_streams_batched_equal_each_stream_alone(loaded: LoadedModel, audio: list[np.ndarray]) -> None:
    """24 streams, four chunk sizes, different lengths, staggered starts and ends, odd piece sizes."""
    rng = np.random.default_rng(7)
    chunk_sizes = [160, 240, 320, 640]
    plans = []
    for i in range(24):
        source = audio[i % 2]
        start = int(rng.integers(0, 8000))
        length = int(rng.integers(16000, len(source) - start))
        plans.append(
            {
                "samples": source[start : start + length],
                "chunk_ms": chunk_sizes[i % 4],
                "left_chunks": [2, 4, 8][i % 3],
                "first_round": i // 3,
            }
        )
    engine = Engine(loaded, EngineOptions(max_streams=24, max_batch=8, endpoint=NO_ENDPOINTS))
    collector = Collector()
    streams = [None] * len(plans)
    cursors = [0] * len(plans)
    round_index = 0
    while any(s is None or not s.done.is_set() for s in streams):
        for i, plan in enumerate(plans):
            if round_index < plan["first_round"]:
                continue
            if streams[i] is None:
                config = StreamConfig(chunk_ms=plan["chunk_ms"], left_chunks=plan["left_chunks"], stream_id=f"s{i}")
                streams[i] = engine.open_stream(config, collector)
            samples = plan["samples"]
            if cursors[i] < len(samples):
                piece = int(rng.integers(1, 2000))
                streams[i].accept_waveform(samples[cursors[i] : cursors[i] + piece])
                cursors[i] += piece
                if cursors[i] >= len(samples):
                    streams[i].input_finished()
        engine.run_once()
        round_index += 1
        assert round_index < 20_000
    assert engine.stats.batch_sizes and max(engine.stats.batch_sizes) > 1, "nothing was batched"
    assert engine.free_slots == 24

    for i, plan in enumerate(plans):
        ref = reference(loaded, plan["samples"], plan["chunk_ms"], plan["left_chunks"])
        partials = collector.partials(f"s{i}")
        (final,) = collector.finals(f"s{i}")
        assert list(partials[-1].tokens) == ref.greedy, f"stream {i}: partial differs from single-stream greedy"
        assert final.tokens == ref.best, f"stream {i}: final differs from single-stream rescoring"
        assert abs(final.nbest[0].score - ref.score) <= max(1e-3, 1e-5 * abs(ref.score))
        assert sorted(e.tokens for e in final.nbest) == sorted(ref.nbest)
        assert final.reason == "input_finished"
        seqs = [e.seq for e in collector.events[f"s{i}"]]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.mark.parametrize(("finalizer", "schedulers"), [("thread", 1), ("process", 1), ("process", 2)])
def test_engine_thread_with_concurrent_producers(
    loaded: LoadedModel, audio: list[np.ndarray], finalizer: str, schedulers: int
) -> None:
    """With ``schedulers`` 2 the streams are shared between two scheduler threads that run
    their batches (the same traced graphs, one cache pool) at once."""
    collector = Collector()
    options = EngineOptions(
        max_streams=6, max_batch=4, max_wait_ms=5, endpoint=NO_ENDPOINTS, finalizer=finalizer, schedulers=schedulers
    )
    with Engine(loaded, options) as engine:
        assert (engine.finalizer_pid is not None) == (finalizer == "process")
        streams = [
            engine.open_stream(StreamConfig(chunk_ms=320, left_chunks=4, stream_id=f"t{i}"), collector)
            for i in range(6)
        ]
        assert [scheduler.open_streams for scheduler in engine.schedulers] == [6 // schedulers] * schedulers
        with pytest.raises(ValueError, match="already open"):
            engine.open_stream(StreamConfig(chunk_ms=320, left_chunks=4, stream_id="t1"), collector)

        def produce(stream, samples: np.ndarray) -> None:
            for k in range(0, len(samples), 320):
                stream.accept_waveform(samples[k : k + 320])
            stream.input_finished()

        threads = [threading.Thread(target=produce, args=(s, audio[i % 2])) for i, s in enumerate(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in streams:
            assert s.done.wait(60)
    assert engine.finalizer_pid is None  # the finals process is stopped with the engine
    assert engine.free_slots == 6 and engine.stats.chunks > 0
    refs = [reference(loaded, audio[k], 320, 4) for k in range(2)]
    for i in range(6):
        (final,) = collector.finals(f"t{i}")
        assert final.tokens == refs[i % 2].best
        ref = refs[i % 2]
        assert list(collector.partials(f"t{i}")[-1].tokens) == ref.greedy
        assert abs(final.nbest[0].score - ref.score) <= max(1e-3, 1e-5 * abs(ref.score))
        assert sorted(entry.tokens for entry in final.nbest) == sorted(ref.nbest)


def test_capacity_close_and_final_on_close(loaded: LoadedModel, audio: list[np.ndarray]) -> None:
    engine = Engine(loaded, EngineOptions(max_streams=2, endpoint=NO_ENDPOINTS))
    collector = Collector()
    first = engine.open_stream(StreamConfig(stream_id="a"), collector)
    engine.open_stream(StreamConfig(stream_id="b"), collector)
    with pytest.raises(CapacityError):
        engine.open_stream(StreamConfig(stream_id="c"), collector)
    first.accept_waveform(audio[0][:24000])  # the call hangs up mid-utterance
    deadline = time.monotonic() + 5.0
    while not collector.partials("a") and time.monotonic() < deadline:
        time.sleep(engine.run_once())  # "b" sends nothing: "a" waits at most max_wait_ms for it
    assert collector.partials("a"), "no partial before the close"
    first.close()
    drain(engine, [first])
    (final,) = collector.finals("a")
    assert final.reason == "closed" and final.tokens
    assert final.tokens == reference(loaded, audio[0][:24000], 160, 8).best
    assert engine.free_slots == 1
    engine.open_stream(StreamConfig(stream_id="c"), collector)  # the freed slot is usable again


@pytest.mark.parametrize("threads", [True, False])
def test_stop_ends_every_open_stream_with_what_was_decoded(
    loaded: LoadedModel, audio: list[np.ndarray], threads: bool
) -> None:
    """A stream still open when the engine stops (its caller never finished it, or the engine
    was too far behind) still gets a Final of what was decoded and, last, Ended: its owner
    must always learn that it ended (the gateway publishes call.ended on it)."""
    engine = Engine(loaded, EngineOptions(max_streams=2, endpoint=NO_ENDPOINTS))
    collector = Collector()
    talking = engine.open_stream(StreamConfig(stream_id="a"), collector)
    engine.open_stream(StreamConfig(stream_id="quiet"), collector)  # opened, never fed
    talking.accept_waveform(audio[0][:24000])
    if threads:
        engine.start()
        deadline = time.monotonic() + 30.0
        while not collector.partials("a") and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        while engine.run_once() == 0.0 or not collector.partials("a"):
            pass
    assert collector.partials("a"), "nothing decoded before the stop"
    engine.stop()
    events = collector.events["a"]
    assert [type(e).__name__ for e in events[-2:]] == ["Final", "Ended"]
    final = collector.finals("a")[-1]
    assert final.reason == "closed" and final.tokens
    assert final.end_ms == collector.partials("a")[-1].end_ms  # everything decoded, nothing more
    assert [type(e).__name__ for e in collector.events["quiet"]] == ["Ended"]
    assert talking.done.is_set() and engine.free_slots == 2


def test_the_last_short_chunk_is_timed_from_the_end_of_input(loaded: LoadedModel, audio: list[np.ndarray]) -> None:
    """A chunk shorter than the window runs only once the input has ended: a caller who hangs
    up a second after the audio must not make that chunk look a second behind real time."""
    engine = Engine(loaded, EngineOptions(max_streams=1, endpoint=NO_ENDPOINTS))
    engine.warm_up()  # trace the graphs first: a trace (a second or more on a busy machine) would make chunks late
    stream = engine.open_stream(StreamConfig(stream_id="a"), Collector())
    stream.accept_waveform(audio[0][: 16000 + 1000])  # 1 s of full chunks and a short tail
    for _ in range(100):
        if engine.run_once() != 0.0 and not stream.next_chunk_frames():
            break
    full_chunks = len(engine.stats.partial_latency_ms)
    assert full_chunks and not stream.next_chunk_frames()  # the tail waits for the input's end
    time.sleep(1.2)
    stream.input_finished()
    drain(engine, [stream])
    tail_latencies = list(engine.stats.partial_latency_ms)[full_chunks:]
    assert tail_latencies and max(tail_latencies) < 1000.0
    assert engine.stats.behind_realtime_chunks == 0


def test_an_engine_behind_real_time_reports_its_lag_and_the_bridge_refuses_new_calls(
    loaded: LoadedModel, audio: list[np.ndarray], tmp_path: Path
) -> None:
    """Back-pressure: chunks left waiting past ``behind_ms`` make the engine ``overloaded``;
    the gateway's admission check then refuses new calls (and counts it) until it caught up."""
    from asr_gateway.bridge import CallBridge
    from kb_hooks.config import KbHooksSettings, RedisSettings
    from kb_hooks.processor import TranscriptProcessor
    from kb_hooks.publisher import Publisher

    engine = Engine(loaded, EngineOptions(max_streams=2, behind_ms=200, endpoint=NO_ENDPOINTS, schedulers=2))
    publisher = Publisher(RedisSettings(url="redis://127.0.0.1:1", spool_dir=tmp_path))  # not started: unused here
    bridge = CallBridge(engine, TranscriptProcessor.from_settings(KbHooksSettings()), publisher)
    stream = engine.open_stream(StreamConfig(stream_id="a"), Collector())
    assert engine.lag_ms == 0.0 and not engine.overloaded and bridge.has_capacity(1)
    stream.accept_waveform(audio[0][:32000])  # 2 s at once: many chunks ready
    time.sleep(0.3)  # nobody ran them: the oldest waits 300 ms > behind_ms
    engine.run_once()
    assert engine.lag_ms >= 300.0 and engine.overloaded
    assert not bridge.has_capacity(1) and bridge.overload_refusals == 1
    while engine.run_once() == 0.0:
        pass
    engine.run_once()
    assert engine.lag_ms < 200.0 and not engine.overloaded
    assert bridge.has_capacity(1) and bridge.overload_refusals == 1


def test_finals_left_waiting_make_the_engine_overloaded_until_they_are_done(
    loaded: LoadedModel, audio: list[np.ndarray]
) -> None:
    """Back-pressure from the finals: an ended utterance waiting past ``finals_behind_ms`` for
    its Final (a finals process starved of CPU) makes the node refuse new calls, like a late chunk."""
    from asr_core.finalizer import FinalJob, UtteranceSnapshot

    engine = Engine(loaded, EngineOptions(max_streams=2, finals_behind_ms=300, endpoint=NO_ENDPOINTS))
    events = Collector()
    stream = engine.open_stream(StreamConfig(stream_id="a"), events)
    stream.accept_waveform(audio[0][:16000])
    while engine.run_once() == 0.0:
        pass
    assert engine.finals_lag_ms == 0.0 and not engine.overloaded
    snapshot = UtteranceSnapshot.of(stream.utterance, stream.chunk_ms)
    engine.finalizer.submit(FinalJob(stream, "endpoint", snapshot, time.monotonic() - 0.2))
    assert 200.0 <= engine.finals_lag_ms < 300.0 and not engine.overloaded
    time.sleep(0.15)  # the utterance waits 150 ms longer for its Final
    assert engine.finals_lag_ms >= 350.0 and engine.overloaded and engine.lag_ms == 0.0
    engine.finalizer.finalize_pending()
    assert engine.finals_lag_ms == 0.0 and not engine.overloaded
    assert len(events.finals("a")) == 1
    with pytest.raises(ValueError, match="finals_niceness must be 0-19"):
        Engine(loaded, EngineOptions(finals_niceness=-1))


def test_bad_stream_configs_are_refused(loaded: LoadedModel) -> None:
    engine = Engine(loaded, EngineOptions(max_streams=1, allowed_chunk_ms=(160, 320)))
    with pytest.raises(ValueError, match="chunk_ms 640 is not one of"):
        engine.open_stream(StreamConfig(chunk_ms=640), print)
    with pytest.raises(ValueError, match="left_chunks must be"):
        engine.open_stream(StreamConfig(left_chunks=99), print)
    assert engine.free_slots == 1


def test_endpoint_splits_utterances_and_resets_the_model_state(loaded: LoadedModel, audio: list[np.ndarray]) -> None:
    """A max-length endpoint every 2 s: consecutive utterances, each decoded from a fresh model state.

    (The fixture's random model does not see silence as blank, so the length rule is the
    deterministic one to drive here; the silence rules are covered in test_endpoint.py.)
    """
    rules = EndpointRules(trailing_silence_ms=10**9, leading_silence_ms=10**9, max_utterance_ms=2000)
    engine = Engine(loaded, EngineOptions(max_streams=1, endpoint=rules))
    collector = Collector()
    stream = engine.open_stream(StreamConfig(chunk_ms=160, left_chunks=4, stream_id="e"), collector)
    stream.accept_waveform(audio[1])
    stream.input_finished()
    drain(engine, [stream])
    finals = collector.finals("e")
    assert [f.reason for f in finals[:-1]] == ["max_length"] * (len(finals) - 1) and len(finals) == 4
    assert [f.utterance_id for f in finals] == [0, 1, 2, 3]
    assert finals[0].begin_ms == 0 and finals[0].end_ms == 13 * 160  # 13 chunks of 160 ms reach 2 s
    assert all(a.end_ms == b.begin_ms for a, b in itertools.pairwise(finals))
    # The first utterance is exactly the first 13 chunks: 12 strides of 16 fbank frames + a
    # 19-frame window = 211 frames = 34000 samples, decoded from scratch.
    assert finals[0].tokens == reference(loaded, audio[1][:34000], 160, 4).best
    partial_ids = [p.utterance_id for p in collector.partials("e")]
    assert partial_ids == sorted(partial_ids)


def test_several_finals_workers_keep_each_streams_events_in_order(loaded: LoadedModel, audio: list[np.ndarray]) -> None:
    """``finals_workers`` 2, each with its own finals process: both search at once, and every
    stream's Finals come in utterance order with its Ended last (a stream keeps one lane)."""
    rules = EndpointRules(trailing_silence_ms=10**9, leading_silence_ms=10**9, max_utterance_ms=1000)
    options = EngineOptions(max_streams=4, max_wait_ms=5, endpoint=rules, finalizer="process", finals_workers=2)
    collector = Collector()
    with Engine(loaded, options) as engine:
        pids = engine.finalizer_pids
        assert len(pids) == 2 and len(set(pids)) == 2 and os.getpid() not in pids
        streams = [
            engine.open_stream(StreamConfig(chunk_ms=160, left_chunks=4, stream_id=f"w{i}"), collector)
            for i in range(4)
        ]
        for i, stream in enumerate(streams):
            stream.accept_waveform(audio[i % 2])
            stream.input_finished()
        for stream in streams:
            assert stream.done.wait(60)
        cpu = [search.cpu_seconds() for search in engine.finalizer.searches]
    assert engine.finalizer_pids == []
    assert all(seconds is not None and seconds > 0 for seconds in cpu)  # both lanes searched
    for i in range(4):
        events = collector.events[f"w{i}"]
        finals = collector.finals(f"w{i}")
        assert len(finals) >= 3 and [f.utterance_id for f in finals] == list(range(len(finals)))
        assert isinstance(events[-1], Ended) and [e.seq for e in events] == sorted(e.seq for e in events)
    with pytest.raises(ValueError, match="finals workers must be at least 1"):
        Engine(loaded, EngineOptions(finals_workers=0))


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_an_hour_long_call_keeps_constant_memory(loaded: LoadedModel, audio: list[np.ndarray]) -> None:
    """60 minutes of audio through one stream, faster than real time: the cache slot is the same
    tensor memory throughout, and the process grows by less than 50 MB after warm-up."""
    engine = Engine(loaded, EngineOptions(max_streams=1, allowed_chunk_ms=(640,), max_left_chunks=2))
    finals: list[Final] = []
    stream = engine.open_stream(
        StreamConfig(chunk_ms=640, left_chunks=2, rescore=False),
        lambda e: finals.append(e) if isinstance(e, Final) else None,
    )
    pool_pointers = (engine.pool.att.data_ptr(), engine.pool.cnn.data_ptr(), engine.pool.pos.data_ptr())
    pool_bytes = engine.pool.total_bytes
    minute = np.resize(np.concatenate([audio[1], audio[0]]), 16000 * 60)  # repeated to fill 60 s
    rss_after_warmup = 0.0
    for minute_index in range(60):
        for start in range(0, len(minute), 16000):
            stream.accept_waveform(minute[start : start + 16000])
            while engine.run_once() == 0.0:
                pass
        if minute_index == 4:
            rss_after_warmup = _rss_mb()
        assert len(stream.utterance.topk_values) <= 20_000 // 640 + 1  # per-utterance buffers stay bounded
    growth = _rss_mb() - rss_after_warmup
    stream.input_finished()
    drain(engine, [stream])
    assert (engine.pool.att.data_ptr(), engine.pool.cnn.data_ptr(), engine.pool.pos.data_ptr()) == pool_pointers
    assert engine.pool.total_bytes == pool_bytes
    assert engine.stats.chunks >= 60 * 60 * 1000 // 640 - 2
    assert len(finals) >= 3_600_000 // 20_480  # the 20 s max-utterance rule ends one every 32 chunks at least
    assert finals[-1].end_ms >= 3_599_000
    assert growth < 50, f"RSS grew by {growth:.1f} MB after warm-up"


def test_int8_backend_rescores_with_an_int8_decoder_and_keeps_the_winners(
    loaded: LoadedModel, audio: list[np.ndarray]
) -> None:
    engine = Engine(loaded, EngineOptions(max_streams=2, backend="torch-int8", endpoint=NO_ENDPOINTS))
    assert engine.decoder is not loaded.model.decoder
    # int8 changes the numbers a little; on this fixture the greedy paths differ in a
    # token or two (see test_model_fast_paths), so compare the text loosely.
    assert_finals_close_to_reference(engine, loaded, audio, chunk_ms=320, left_chunks=4)


def test_dtype_names_resolve_or_say_why_not() -> None:
    assert resolve_dtype("float32", "cpu") is torch.float32
    with pytest.raises(ValueError, match="float16 needs a GPU"):
        resolve_dtype("float16", "cpu")
    with pytest.raises(ValueError, match="unknown"):
        resolve_dtype("int4", "cpu")


@pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="needs oneDNN bf16 kernels: an x86 CPU with AVX-512 (native with AVX512-BF16 or AMX); AVX2-only CPUs skip",
)
def test_bfloat16_engine_keeps_the_winners(loaded: LoadedModel, audio: list[np.ndarray]) -> None:
    own = load_wenet_model(FIXTURE / "model")  # the engine casts the model it is given
    engine = Engine(own, EngineOptions(max_streams=2, dtype=resolve_dtype("bfloat16", "cpu"), endpoint=NO_ENDPOINTS))
    assert engine.pool.att.dtype == torch.bfloat16
    assert_finals_close_to_reference(engine, loaded, audio, chunk_ms=160, left_chunks=8)


def assert_finals_close_to_reference(
    engine: Engine, loaded: LoadedModel, audio: list[np.ndarray], chunk_ms: int, left_chunks: int
) -> None:
    """One stream per recording through a lossy engine (int8, bf16): each final is within 20 %
    token edit distance of the float reference's rescored best."""
    collector = Collector()
    config = StreamConfig(chunk_ms=chunk_ms, left_chunks=left_chunks)
    streams = [engine.open_stream(replace(config, stream_id=f"lossy{i}"), collector) for i in range(len(audio))]
    for stream, samples in zip(streams, audio, strict=True):
        stream.accept_waveform(samples)
        stream.input_finished()
    drain(engine, streams)
    for i, samples in enumerate(audio):
        (final,) = collector.finals(f"lossy{i}")
        ref = reference(loaded, samples, chunk_ms, left_chunks)
        assert edit_distance(ref.best, final.tokens) <= 0.2 * len(ref.best)


def test_each_batch_attends_over_its_streams_window_not_the_pools(loaded: LoadedModel) -> None:
    """The pool is sized for the largest chunk (640 ms x 8 left chunks = 128 frames); a batch
    attends over the largest window its streams keep (chunk x left chunks), so graphs are built
    for those windows: each allowed chunk size at 8 left chunks, plus the shapes ``warm_up`` is
    given (the many-streams test above checks the outputs of mixed windows)."""
    engine = Engine(loaded, EngineOptions(max_streams=2, traced_step=True))
    frame_ms = engine.frame_ms
    assert engine.pool.window == 640 // frame_ms * 8
    engine.warm_up(streams=[(320, 4)])
    runner = engine.runner
    assert runner.traced is not None
    windows = sorted({window for _, window, _ in runner.traced._graphs})
    widest = [min(engine.pool.window, chunk_ms // frame_ms * 8) for chunk_ms in (160, 240, 320, 640)]
    assert windows == sorted({*widest, 320 // frame_ms * 4})
    with pytest.raises(ValueError, match=r"left_chunks must be 1\.\.8"):
        engine.warm_up(streams=[(320, 9)])
    stream = engine.open_stream(StreamConfig(chunk_ms=320, left_chunks=2), lambda event: None)
    assert stream.cache_frames == 320 // frame_ms * 2
