"""Graceful degradation: the surge policy (sans-IO) and streams changing chunk size mid-call.

A stream moved from 160 to 320 ms chunks between two chunks must give what the model gives for
that schedule: WeNet's ``forward_chunk`` fed the same fbank frames, contiguous, with the chunk
size changing at the same chunk and the same attention window (``required_cache_size``). The
fixture model (random weights) checks that bit for bit; the bundled demo model checks that the
text of a recording switched mid-utterance is still its reference.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from asr_core.audio_io import read_wav
from asr_core.ctc_search import ctc_greedy_batch, ctc_prefix_beam_search
from asr_core.endpoint import EndpointRules
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.events import Event, Final, Partial
from asr_core.frontend import compute_fbank
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.stream import StreamConfig
from asr_core.surge import (
    FINALS_REDUCTIONS,
    TRANSITIONS,
    Band,
    ChunkMove,
    Direction,
    FinalsReduction,
    Level,
    SurgeController,
    SurgeSettings,
    SurgeStream,
    chunk_ladder,
    finals_reduction,
    surge_lag_ms,
)
from rescoring.attention import attention_rescore

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT.parent / "shared" / "fixtures" / "wenet_u2pp_small"
DEMO_MODEL = ROOT / "asr_core" / "demo_model"
DEMO_DATA = ROOT / "asr_gateway" / "dev" / "data"
NO_ENDPOINTS = EndpointRules(trailing_silence_ms=10**9, leading_silence_ms=10**9, max_utterance_ms=10**9)
NEVER = SurgeSettings(degrade_ms=10**9, restore_ms=0)  # ladders without the controller moving anyone

needs_fixture = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"WeNet fixture not found at {FIXTURE}")
needs_demo_model = pytest.mark.skipif(
    not (DEMO_MODEL / "final.pt").is_file(), reason="bundled demo model not installed"
)


# -- the policy ----------------------------------------------------------------------------


def view(stream_id: str, chunk_ms: int, priority: int = 0, ladder: tuple[int, ...] = (160, 320, 640)) -> SurgeStream:
    return SurgeStream(stream_id, priority, ladder, chunk_ms)


def test_the_table_covers_every_level_and_band() -> None:
    assert set(TRANSITIONS) == {(level, band) for level in Level for band in Band}
    assert TRANSITIONS[(Level.ALL, Band.HIGH)] is Direction.HOLD
    assert {TRANSITIONS[(level, Band.MID)] for level in Level} == {Direction.HOLD}


def test_lowest_priority_moves_first_a_share_at_a_time_and_one_size_per_step() -> None:
    policy = SurgeController(
        SurgeSettings(degrade_ms=300, degrade_after_s=0.0, restore_ms=100, step_interval_s=2.0, step_share=0.25)
    )
    streams = [view("vip", 160, priority=5), view("a", 160), view("b", 160), view("c", 160)]
    assert policy.decide(0.0, 299.0, streams) == ()
    assert policy.decide(0.0, 300.0, streams) == (ChunkMove("a", 320),)
    streams[1] = view("a", 320)
    assert policy.decide(1.0, 900.0, streams) == (), "too soon after the last move"
    assert policy.decide(2.0, 900.0, streams) == (ChunkMove("b", 320),), "the least degraded of the lowest priority"
    streams = [view("vip", 160, priority=5), view("a", 640), view("b", 640), view("c", 640)]
    assert policy.decide(4.0, 900.0, streams) == (ChunkMove("vip", 320),)


def test_moves_back_only_after_a_calm_spell_highest_priority_first() -> None:
    policy = SurgeController(SurgeSettings(degrade_ms=300, restore_ms=100, restore_after_s=10.0, step_interval_s=2.0))
    streams = [view("vip", 320, priority=5), view("a", 640), view("b", 320)]
    assert policy.decide(0.0, 50.0, streams) == ()
    assert policy.decide(5.0, 200.0, streams) == (), "between the thresholds: hold, and the calm spell restarts"
    assert policy.decide(6.0, 50.0, streams) == ()
    assert policy.decide(15.9, 50.0, streams) == ()
    assert policy.decide(16.0, 50.0, streams) == (ChunkMove("vip", 160),)
    streams[0] = view("vip", 160, priority=5)
    assert policy.decide(20.0, 50.0, streams) == (), "each step back waits for a calm spell of its own"
    assert policy.decide(26.0, 50.0, streams) == (ChunkMove("a", 320),), "the most degraded next"


def test_a_spike_moves_nothing_lag_that_lasts_moves_a_share() -> None:
    policy = SurgeController(SurgeSettings(degrade_ms=300, degrade_after_s=1.0, step_interval_s=2.0))
    streams = [view("a", 160), view("b", 160), view("c", 160), view("d", 160)]
    assert policy.decide(0.0, 900.0, streams) == (), "one late batch"
    assert policy.decide(0.5, 120.0, streams) == (), "caught up: the spell ends"
    assert policy.decide(1.2, 900.0, streams) == ()
    assert policy.decide(2.1, 900.0, streams) == (), "behind for 0.9 s"
    assert policy.decide(2.2, 900.0, streams) == (ChunkMove("a", 320),), "behind for 1 s"
    streams[0] = view("a", 320)
    assert policy.decide(3.5, 900.0, streams) == (), "too soon after the last move"
    assert policy.decide(4.0, 50.0, streams) == ()
    assert policy.decide(4.5, 900.0, streams) == (), "the lag came back 0 s ago"
    assert policy.decide(5.5, 900.0, streams) == (ChunkMove("b", 320),), "and has lasted 1 s"


def test_saturated_when_behind_with_nothing_left_to_move() -> None:
    policy = SurgeController(SurgeSettings(degrade_after_s=0.0))
    never = view("never", 160, ladder=(160,))
    assert policy.decide(0.0, 5000.0, [never]) == () and policy.saturated
    assert policy.decide(0.0, 5000.0, [never, view("a", 320)]) == (ChunkMove("a", 640),)
    assert not policy.saturated
    assert policy.decide(0.0, 50.0, [never]) == () and not policy.saturated


def test_saturation_lasts_until_the_lag_is_low_again() -> None:
    """Entered at a HIGH sample, kept through MID ones (300 > lag > 100 ms), left at a LOW one;
    a MID sample alone does not enter it, and a stream that can move again ends it."""
    policy = SurgeController(SurgeSettings(degrade_after_s=0.0))
    never = view("never", 160, ladder=(160,))
    samples = [(150.0, False), (400.0, True), (150.0, True), (250.0, True), (80.0, False), (250.0, False)]
    for lag_ms, saturated in samples:
        policy.decide(0.0, lag_ms, [never])
        assert policy.saturated is saturated, lag_ms
    policy.decide(0.0, 400.0, [never])
    policy.decide(0.0, 150.0, [never, view("a", 160)])
    assert not policy.saturated


def test_settings_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="restore_ms"):
        SurgeSettings(degrade_ms=100, restore_ms=100)
    with pytest.raises(ValueError, match="step_share"):
        SurgeSettings(step_share=0)


def test_the_ladder_keeps_the_attention_window() -> None:
    allowed = (160, 240, 320, 640)
    assert chunk_ladder(160, 8, 640, allowed, 40) == ((160, 8), (320, 4), (640, 2))
    assert chunk_ladder(320, 4, 640, allowed, 40) == ((320, 4), (640, 2))
    assert chunk_ladder(160, 8, 320, allowed, 40) == ((160, 8), (320, 4))
    assert chunk_ladder(160, 8, 160, allowed, 40) == ((160, 8),), "never degrade"
    assert chunk_ladder(160, 3, 640, allowed, 40) == ((160, 3), (240, 2)), "320 does not divide a 480 ms window"
    assert chunk_ladder(160, 1, 640, allowed, 40) == ((160, 1),), "a window of one chunk has nowhere to go"
    assert chunk_ladder(240, 8, 640, allowed, 40) == ((240, 8), (320, 6), (640, 3))


# -- the mechanism, against WeNet's forward_chunk --------------------------------------------


def encode_with_schedule(
    loaded: LoadedModel, fbank: torch.Tensor, chunks: list[int], cache_frames: int
) -> torch.Tensor:
    """WeNet's streaming loop with chunk ``i`` of ``chunks[i]`` encoder frames: each window
    starts where the previous chunk's stride ended, so the fbank is read once, in order.
    fbank (T, n_mels) -> encoder output (T', D)."""
    encoder = loaded.model.encoder
    rate, context = encoder.subsampling_rate, encoder.right_context + 1
    xs = fbank.unsqueeze(0)
    att: torch.Tensor | None = None
    cnn: torch.Tensor | None = None
    outputs, start, offset = [], 0, 0
    with torch.inference_mode():
        for chunk in chunks:
            assert start + context <= xs.size(1), "schedule longer than the audio"
            end = min(start + (chunk - 1) * rate + context, xs.size(1))
            ys, att, cnn = encoder.forward_chunk(xs[:, start:end], offset, cache_frames, att, cnn)
            outputs.append(ys[0])
            offset += ys.size(1)
            start += rate * chunk
    assert start + context > xs.size(1), "audio left after the schedule"
    return torch.cat(outputs)


def decode_switched(loaded: LoadedModel, samples: np.ndarray, switch_after: int, options: EngineOptions) -> list[Event]:
    """One stream at 160 ms x 8 left chunks, moved to 320 ms x 4 after ``switch_after`` chunks."""
    engine = Engine(loaded, options)
    events: list[Event] = []
    stream = engine.open_stream(
        StreamConfig(chunk_ms=160, left_chunks=8, max_chunk_ms=320, emit_unchanged_partials=True, stream_id="s"),
        events.append,
    )
    assert stream.ladder == ((160, 8), (320, 4))
    slot_window = engine.pool.window_of(stream.slot)
    stream.accept_waveform(samples)
    stream.input_finished()
    while sum(isinstance(e, Partial) for e in events) < switch_after:
        engine.run_once()
    stream.set_chunk(320, 8, time.monotonic())  # between chunks; here the test is the scheduler thread
    while not stream.done.is_set():
        engine.run_once()
    assert engine.pool.used_slots == 0
    assert slot_window == 32, "the slot's window (encoder frames) is the same at both sizes"
    return events


@needs_fixture
def test_a_stream_moved_mid_utterance_gives_what_the_model_gives_for_that_schedule() -> None:
    torch.set_num_threads(1)
    loaded = load_wenet_model(FIXTURE / "model")
    samples = read_wav(FIXTURE / "wav" / "utt1.wav").samples
    events = decode_switched(loaded, samples, 7, EngineOptions(max_streams=2, endpoint=NO_ENDPOINTS, surge=NEVER))
    partials = [e for e in events if isinstance(e, Partial)]
    (final,) = [e for e in events if isinstance(e, Final)]

    schedule = [p.chunk_ms for p in partials]
    assert schedule[:7] == [160] * 7 and set(schedule[7:]) == {320}
    # No audio lost or read twice: each partial ends where the previous one did plus its chunk
    # (the last may be short), and the utterance ends where WeNet's loop over the same fbank does.
    ends = [0] + [p.end_ms for p in partials]
    steps = [b - a for a, b in itertools.pairwise(ends)]
    assert steps[:-1] == schedule[:-1] and 0 < steps[-1] <= schedule[-1]
    fbank = torch.from_numpy(compute_fbank(samples))
    encoder_out = encode_with_schedule(loaded, fbank, [ms // 40 for ms in schedule], cache_frames=32)
    assert final.end_ms == partials[-1].end_ms == encoder_out.shape[0] * 40
    assert final.chunk_ms == 320

    log_probs = loaded.model.ctc_log_probs(encoder_out.unsqueeze(0))  # (1, T', V)
    greedy = ctc_greedy_batch(log_probs, torch.tensor([encoder_out.shape[0]]))[0]
    assert list(partials[-1].tokens) == greedy
    nbest = ctc_prefix_beam_search(log_probs[0], beam=10)
    (best,) = attention_rescore(
        loaded.model.decoder, [encoder_out], [nbest], sos=loaded.sos_id, eos=loaded.eos_id,
        ctc_weight=0.5, reverse_weight=0.3,
    )  # fmt: skip
    assert final.tokens == best.tokens


@needs_fixture
def test_a_scheduler_behind_moves_its_streams_up_and_counts_it() -> None:
    torch.set_num_threads(1)
    loaded = load_wenet_model(FIXTURE / "model")
    samples = read_wav(FIXTURE / "wav" / "utt1.wav").samples
    settings = SurgeSettings(
        degrade_ms=200, degrade_after_s=0.0, restore_ms=50, step_interval_s=0.0, sample_interval_s=0.0
    )
    engine = Engine(loaded, EngineOptions(max_streams=3, endpoint=NO_ENDPOINTS, surge=settings))
    events: list[Event] = []
    never = engine.open_stream(StreamConfig(chunk_ms=160, max_chunk_ms=160, stream_id="never"), events.append)
    low = engine.open_stream(StreamConfig(chunk_ms=160, max_chunk_ms=640, stream_id="low"), events.append)
    for stream in (never, low):
        stream.accept_waveform(samples[:48000])  # 3 s at once: many chunks ready
    time.sleep(0.3)  # nobody ran them: the oldest waits 300 ms > degrade_ms
    engine.run_once()  # lag measured
    engine.run_once()  # and acted on
    assert (never.chunk_ms, low.chunk_ms) == (160, 320) and engine.degraded_streams == 1
    assert low.degraded_since > 0.0 and engine.stats.chunk_moves_up == 1
    for stream in (never, low):
        stream.input_finished()
    while not (never.done.is_set() and low.done.is_set()):
        engine.run_once()
    assert engine.stats.degraded_stream_seconds > 0.0
    assert {e.chunk_ms for e in events if isinstance(e, Partial) and e.stream_id == "never"} == {160}
    assert 320 in {e.chunk_ms for e in events if isinstance(e, Partial) and e.stream_id == "low"}


def test_finals_that_still_queue_past_their_reduce_time_count_as_lag() -> None:
    """The controller acts on the chunks' lag, or on the finals' wait past finals_reduce_ms
    (1500 ms) where that is longer: finals searched the cheap way that still queue need the CPU
    a longer chunk frees."""
    settings = SurgeSettings(finals_reduce_ms=1500.0)
    assert surge_lag_ms(settings, 120.0, 900.0) == 120.0  # finals within their time: the chunks' lag
    assert surge_lag_ms(settings, 120.0, 1800.0) == 300.0  # 300 ms past it: HIGH (degrade_ms 300)
    assert surge_lag_ms(settings, 450.0, 1800.0) == 450.0


@needs_fixture
def test_a_scheduler_whose_finals_lag_moves_its_streams_up_though_its_chunks_are_on_time() -> None:
    torch.set_num_threads(1)
    loaded = load_wenet_model(FIXTURE / "model")
    samples = read_wav(FIXTURE / "wav" / "utt1.wav").samples
    settings = SurgeSettings(degrade_after_s=0.0, restore_after_s=0.0, step_interval_s=0.0, sample_interval_s=0.0)
    engine = Engine(loaded, EngineOptions(max_streams=2, endpoint=NO_ENDPOINTS, surge=settings))
    low = engine.open_stream(StreamConfig(chunk_ms=160, max_chunk_ms=640, stream_id="low"), lambda _: None)
    low.accept_waveform(samples[:2560])  # one chunk, on time
    engine.run_once()
    assert low.chunk_ms == 160 and engine.degraded_streams == 0
    finals_wait_s = [2.0]  # the oldest ended utterance's wait for its final: 500 ms past finals_reduce_ms
    engine.finalizer.lag_s = lambda now=None: finals_wait_s[0]  # type: ignore[method-assign]
    engine.run_once()
    assert low.chunk_ms == 320 and engine.degraded_streams == 1 and engine.lag_ms < settings.degrade_ms
    finals_wait_s[0] = 0.0  # caught up: the lag is LOW, the stream moves back
    engine.run_once()
    assert low.chunk_ms == 160 and engine.degraded_streams == 0 and engine.stats.chunk_moves_down == 1


@needs_demo_model
def test_the_demo_model_still_gets_a_recording_right_when_switched_mid_utterance() -> None:
    """U2++ chunk attention depends on chunk size, so the text of an utterance decoded partly at
    160 and partly at 320 ms is not bitwise any fixed size's; the bundled recording's reference
    text is what it must still give."""
    torch.set_num_threads(1)
    loaded = load_wenet_model(DEMO_MODEL)
    reference = dict(line.split(maxsplit=1) for line in (DEMO_DATA / "text").read_text("utf-8").splitlines())
    samples = read_wav(DEMO_DATA / "hotline_seed.wav").samples
    events = decode_switched(loaded, samples, 10, EngineOptions(max_streams=1, endpoint=NO_ENDPOINTS, surge=NEVER))
    (final,) = [e for e in events if isinstance(e, Final)]
    partials = [e for e in events if isinstance(e, Partial)]
    assert {p.chunk_ms for p in partials[:10]} == {160} and {p.chunk_ms for p in partials[10:]} == {320}
    assert final.end_ms == partials[-1].end_ms
    assert final.text == reference["hotline_seed"]


# -- the route's and the service's settings ---------------------------------------------------


def test_a_route_says_how_far_it_gives_way_and_the_service_turns_it_on() -> None:
    from pydantic import ValidationError

    from asr_gateway.bridge import stream_config
    from asr_gateway.config import SurgeConfig
    from calls.profile import Profile

    profile = Profile.model_validate({"chunk_ms": 160, "left_chunks": 8, "surge": {"max_chunk_ms": 320, "priority": 2}})
    config = stream_config(profile, stream_id="leg")
    assert (config.chunk_ms, config.left_chunks, config.max_chunk_ms, config.surge_priority) == (160, 8, 320, 2)
    assert Profile().surge.max_chunk_ms == 640, "routes give way up to 640 ms unless they say otherwise"
    with pytest.raises(ValidationError, match="set it to 320 for a route that never degrades"):
        Profile.model_validate({"chunk_ms": 320, "surge": {"max_chunk_ms": 160}})
    assert SurgeConfig().settings() is None, "off unless enabled"
    assert SurgeConfig(enabled=True, degrade_ms=500).settings() == SurgeSettings(degrade_ms=500)
    with pytest.raises(ValidationError, match="restore_ms"):
        SurgeConfig(restore_ms=400)


# -- admission follows the measured capacity --------------------------------------------------


def test_costs_are_per_stream_second_and_follow_the_latest_batches() -> None:
    from asr_core.capacity import ChunkCosts

    costs = ChunkCosts(smoothing=0.5)
    assert costs.cost(160) is None and costs.load([160]) is None
    costs.observe(160, streams=4, seconds=0.064)  # 4 x 160 ms of audio in 64 ms: 0.1 s per s
    assert costs.cost(160) == pytest.approx(0.1)
    costs.observe(160, streams=4, seconds=0.128)
    assert costs.cost(160) == pytest.approx(0.15)
    costs.observe(640, streams=8, seconds=0.256)
    assert costs.load([160, 160, 640]) == pytest.approx(0.35)
    assert costs.load([160, 320]) is None, "a size never run has no estimate"


@needs_fixture
def test_under_surge_a_late_chunk_is_full_only_when_nothing_is_left_to_move() -> None:
    torch.set_num_threads(1)
    loaded = load_wenet_model(FIXTURE / "model")
    samples = read_wav(FIXTURE / "wav" / "utt1.wav").samples
    settings = SurgeSettings(
        degrade_ms=100, degrade_after_s=0.0, restore_ms=50, step_interval_s=10.0, sample_interval_s=0.0
    )
    options = EngineOptions(max_streams=2, behind_ms=200, endpoint=NO_ENDPOINTS, surge=settings)

    movable = Engine(loaded, options)
    stream = movable.open_stream(StreamConfig(chunk_ms=160, max_chunk_ms=640, stream_id="a"), lambda e: None)
    stream.accept_waveform(samples[:32000])
    time.sleep(0.3)  # nobody ran them: the oldest waits 300 ms > behind_ms
    movable.run_once()
    movable.run_once()
    assert movable.lag_ms > 200.0 and stream.chunk_ms == 320, "behind, and the stream moved up"
    assert not movable.overloaded, "longer chunks may still catch up (640 ms not measured yet): room for a call"
    movable.schedulers[0].costs.observe(640, streams=1, seconds=0.5)  # 640 ms of audio cost 500 ms
    assert movable.overloaded, "even its longest chunks would fall behind: full"

    fixed = Engine(loaded, options)
    stream = fixed.open_stream(StreamConfig(chunk_ms=160, max_chunk_ms=160, stream_id="b"), lambda e: None)
    stream.accept_waveform(samples[:32000])
    time.sleep(0.3)  # nobody ran them: the oldest waits 300 ms > behind_ms
    fixed.run_once()
    fixed.run_once()
    assert fixed.lag_ms > 200.0 and fixed.overloaded, "behind with nothing left to move: full"


# -- finals under surge -------------------------------------------------------------------------


@needs_fixture
def test_finals_that_waited_are_searched_the_cheaper_way_and_say_so() -> None:
    from asr_core.finalizer import FinalJob, UtteranceSnapshot

    torch.set_num_threads(1)
    loaded = load_wenet_model(FIXTURE / "model")
    samples = read_wav(FIXTURE / "wav" / "utt1.wav").samples
    settings = SurgeSettings(finals_reduce_ms=500, finals_beam=2)
    engine = Engine(loaded, EngineOptions(max_streams=1, endpoint=NO_ENDPOINTS, attention_beam=2, surge=settings))
    assert (engine.finalizer.reduced_settings.beam, engine.finalizer.reduced_settings.attention_beam) == (2, 0)
    events: list[Event] = []
    stream = engine.open_stream(StreamConfig(stream_id="a"), events.append)
    stream.accept_waveform(samples[:32000])
    while engine.run_once() == 0.0:
        pass
    snapshot = UtteranceSnapshot.of(stream.utterance, stream.chunk_ms)
    engine.finalizer.submit(FinalJob(stream, "silence", snapshot, time.monotonic()))
    engine.finalize_pending()
    engine.finalizer.submit(FinalJob(stream, "silence", snapshot, time.monotonic() - 0.6))
    engine.finalize_pending()
    fresh, waited = [e for e in events if isinstance(e, Final)]
    assert fresh.reduced_search is None and len(fresh.nbest) > 2
    assert waited.reduced_search is FinalsReduction.FINALS_QUEUED and len(waited.nbest) <= 2
    assert engine.stats.reduced_finals == 1


def test_finals_give_way_while_saturated_or_once_they_waited_and_say_why() -> None:
    """(saturated, waited past finals_reduce_ms): where both hold the waiting is the reason, so
    ``engine_saturated`` counts only the finals that saturation made cheaper."""
    assert set(FINALS_REDUCTIONS) == {(saturated, waited) for saturated in (False, True) for waited in (False, True)}
    on = SurgeSettings(finals_reduce_ms=1500.0)
    off = SurgeSettings(finals_reduce_ms=1500.0, finals_reduce_when_saturated=False)
    queued, saturated = FinalsReduction.FINALS_QUEUED, FinalsReduction.ENGINE_SATURATED
    table = [  # saturated, waited ms -> why with the rule on, with it off
        (False, 0.0, None, None),
        (False, 1499.9, None, None),
        (False, 1500.0, queued, queued),
        (True, 0.0, saturated, None),
        (True, 1499.9, saturated, None),
        (True, 1500.0, queued, queued),
    ]
    for is_saturated, waited_ms, with_rule, without_rule in table:
        assert finals_reduction(on, saturated=is_saturated, waited_ms=waited_ms) is with_rule
        assert finals_reduction(off, saturated=is_saturated, waited_ms=waited_ms) is without_rule
    assert SurgeSettings().finals_reduce_when_saturated, "on by default"


def decode_behind(loaded: LoadedModel, max_chunk_ms: int, settings: SurgeSettings) -> tuple[Engine, Final]:
    """One 160 ms stream given all of a recording at once, so its scheduler is behind from the
    first step on (no sleep needed: each chunk has waited for every step before it), decoded to
    its one Final. ``max_chunk_ms`` 160: nothing left to move, the scheduler is saturated."""
    engine = Engine(loaded, EngineOptions(max_streams=1, endpoint=NO_ENDPOINTS, surge=settings))
    events: list[Event] = []
    stream = engine.open_stream(StreamConfig(chunk_ms=160, max_chunk_ms=max_chunk_ms, stream_id="s"), events.append)
    stream.accept_waveform(read_wav(DEMO_DATA / "hotline_seed.wav").samples)
    stream.input_finished()
    while not stream.done.is_set():
        engine.run_once()
    (final,) = [e for e in events if isinstance(e, Final)]
    return engine, final


@needs_demo_model
def test_a_saturated_scheduler_makes_finals_reduced_one_with_streams_left_to_move_does_not() -> None:
    torch.set_num_threads(1)
    loaded = load_wenet_model(DEMO_MODEL)
    behind = SurgeSettings(  # behind after 1 ms; finals never wait long enough to be reduced for it
        degrade_ms=1.0, restore_ms=0.5, degrade_after_s=0.0, step_interval_s=10**9, sample_interval_s=0.0,
        finals_reduce_ms=10**9, finals_beam=2,
    )  # fmt: skip

    saturated, final = decode_behind(loaded, max_chunk_ms=160, settings=behind)
    assert final.reduced_search is FinalsReduction.ENGINE_SATURATED and len(final.nbest) <= 2
    assert saturated.stats.reduced_finals_by_reason == {
        FinalsReduction.FINALS_QUEUED: 0,
        FinalsReduction.ENGINE_SATURATED: 1,
    }
    assert final.chunk_ms == 160 and saturated.stats.chunk_moves_up == 0

    movable, final = decode_behind(loaded, max_chunk_ms=640, settings=behind)
    assert movable.stats.chunk_moves_up == 1 and final.chunk_ms == 320, "moved once; 640 ms still left"
    assert final.reduced_search is None and len(final.nbest) > 2 and movable.stats.reduced_finals == 0

    told_not_to, final = decode_behind(
        loaded, max_chunk_ms=160, settings=replace(behind, finals_reduce_when_saturated=False)
    )
    assert final.reduced_search is None and told_not_to.stats.reduced_finals == 0


@needs_demo_model
def test_one_saturated_scheduler_makes_every_final_reduced_the_finals_cpu_is_shared() -> None:
    torch.set_num_threads(1)
    loaded = load_wenet_model(DEMO_MODEL)
    behind = SurgeSettings(
        degrade_ms=1.0, restore_ms=0.5, degrade_after_s=0.0, step_interval_s=10**9, sample_interval_s=0.0,
        finals_reduce_ms=10**9,
    )  # fmt: skip
    engine = Engine(loaded, EngineOptions(max_streams=2, schedulers=2, endpoint=NO_ENDPOINTS, surge=behind))
    events: list[Event] = []
    fixed = engine.open_stream(StreamConfig(chunk_ms=160, max_chunk_ms=160, stream_id="fixed"), events.append)
    movable = engine.open_stream(StreamConfig(chunk_ms=160, max_chunk_ms=640, stream_id="movable"), events.append)
    assert [list(s.streams) for s in engine.schedulers] == [["fixed"], ["movable"]]
    samples = read_wav(DEMO_DATA / "hotline_seed.wav").samples
    for stream in (fixed, movable):
        stream.accept_waveform(samples)
        stream.input_finished()
    while not movable.done.is_set():  # at 320 ms it ends first, while "fixed" is still behind
        engine.run_once()
    assert not engine.schedulers[1].saturated and engine.schedulers[0].saturated
    (final,) = [e for e in events if isinstance(e, Final)]
    assert final.stream_id == "movable" and final.chunk_ms == 320
    assert final.reduced_search is FinalsReduction.ENGINE_SATURATED


@needs_demo_model
def test_finals_go_back_to_the_full_search_when_saturation_ends() -> None:
    from asr_core.finalizer import FinalJob, UtteranceSnapshot

    torch.set_num_threads(1)
    loaded = load_wenet_model(DEMO_MODEL)
    behind = SurgeSettings(
        degrade_ms=1.0,
        restore_ms=0.5,
        degrade_after_s=0.0,
        sample_interval_s=0.0,
        finals_reduce_ms=10**9,
        finals_beam=2,
    )
    engine = Engine(loaded, EngineOptions(max_streams=1, endpoint=NO_ENDPOINTS, surge=behind))
    events: list[Event] = []
    stream = engine.open_stream(StreamConfig(chunk_ms=160, max_chunk_ms=160, stream_id="s"), events.append)
    stream.accept_waveform(read_wav(DEMO_DATA / "hotline_seed.wav").samples)
    while engine.run_once() == 0.0:  # every full chunk decoded; the latest sample saw the last one late
        pass
    snapshot = UtteranceSnapshot.of(stream.utterance, stream.chunk_ms)
    assert engine.saturated
    engine.finalizer.submit(FinalJob(stream, "silence", snapshot, time.monotonic()))
    engine.finalize_pending()
    engine.run_once()  # nothing ready: caught up
    assert not engine.saturated
    engine.finalizer.submit(FinalJob(stream, "silence", snapshot, time.monotonic()))
    engine.finalize_pending()
    during, after = [e for e in events if isinstance(e, Final)]
    assert during.reduced_search is FinalsReduction.ENGINE_SATURATED and len(during.nbest) <= 2
    assert after.reduced_search is None and len(after.nbest) > 2


# -- what a reduced final says on the wire (docs/events.md reduced_search, reduced_reason) -------


def test_a_reduced_final_says_why_in_the_event_and_the_schema_allows_only_those_reasons() -> None:
    import dataclasses
    from typing import get_args

    import jsonschema

    from asr_gateway.bridge import REDUCED_REASONS, _update
    from kb_hooks import events as ev
    from kb_hooks.config import KbHooksSettings
    from kb_hooks.processor import TranscriptProcessor
    from kb_hooks.types import CallContext, Participant, ReducedReason

    assert {reason: reason.value for reason in FinalsReduction} == REDUCED_REASONS
    assert set(get_args(ReducedReason)) == {reason.value for reason in FinalsReduction}
    processor = TranscriptProcessor.from_settings(KbHooksSettings())
    call, caller, units = CallContext("c1"), Participant("caller"), ["<blank>", "井", "盖"]
    final = Final("s", 0, 1, "井盖", (1, 2), (0, 40), 0, 80, "silence", nbest=(), chunk_ms=160)
    for reduced, search, reason in [
        (None, None, None),
        (FinalsReduction.FINALS_QUEUED, True, "finals_queued"),
        (FinalsReduction.ENGINE_SATURATED, True, "engine_saturated"),
    ]:
        update = _update(call, caller, dataclasses.replace(final, reduced_search=reduced), units)
        assert (update.reduced_search, update.reduced_reason) == (search, reason)
        (event, *_) = processor.process(update)
        wire = {**event.to_json(), "seq": 1}
        jsonschema.validate(wire, ev.schema())
        assert (wire.get("reduced_search"), wire.get("reduced_reason")) == (search, reason)
    unknown = {**wire, "reduced_reason": "tired"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(unknown, ev.schema())
    without_search = {key: value for key, value in wire.items() if key != "reduced_search"}
    with pytest.raises(jsonschema.ValidationError, match="reduced_search"):
        jsonschema.validate(without_search, ev.schema())
    with pytest.raises(ValueError, match="not searched the reduced way"):
        ev.TranscriptFinal(call=call, participant=caller, utterance_id=0, text="井盖", begin_offset_ms=0,
                           end_offset_ms=80, tokens=(), confidence=None, latency_ms=None, nbest=(),
                           reduced_reason="engine_saturated")  # fmt: skip
