"""The trailing-silence rule holds at every frame, not only at chunk ends (issue #42).

WeNet's runtime checks its endpoint rules once per chunk, so a pause that reaches
``trailing_silence_ms`` inside a chunk and gives way to speech before the chunk's end passes
unnoticed: at 640 ms chunks most 1 s pauses do. ``EndpointRules.check_every_frame`` ends the
utterance where the pause reached the rule and reads the rest of the chunk again as the next
utterance's start (``Stream.rewind``). Checked here: the rule itself on hand-made frames, and
the bundled demo model on real recordings, where utterances now end at the same pauses with the
same text whatever the chunk size (surge moves calls between sizes mid-call).
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

from asr_core.audio_io import read_wav
from asr_core.endpoint import TRAILING_SILENCE, EndpointRules, silence_ends_inside, update_endpoints
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.events import Final
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.stream import StreamConfig
from deploy.bench import endpoint_phases
from tests.demo_quality import DEMO_MODEL

FRAME_MS = 40
RULES = EndpointRules(blank_threshold=0.8, trailing_silence_ms=800)  # 20 silent frames end an utterance
SILENT, SPEECH = 0.99, 0.1  # P(blank) of a silent and of a speech frame


def ends_inside(
    rows: list[list[float]], trailing: list[int], had_tokens: list[bool], frames: list[int] | None = None
) -> list[int]:
    blank = np.array(rows)
    return silence_ends_inside(
        RULES,
        FRAME_MS,
        blank,
        np.array(trailing, dtype=np.int64),
        np.array(had_tokens),
        blank <= RULES.blank_threshold,
        None,
        None if frames is None else np.array(frames, dtype=np.int64),
    ).tolist()


def test_a_pause_that_reaches_the_rule_inside_a_chunk_ends_the_utterance_there() -> None:
    # 18 silent frames before the chunk: the 2nd silent frame of the chunk makes 20.
    row = [SILENT, SILENT, SILENT, SPEECH, SPEECH, SILENT, SILENT, SILENT]
    assert ends_inside([row], [18], [True]) == [2]
    # Silent to the chunk's end: WeNet's check at the chunk's end sees it; nothing to split.
    assert ends_inside([[SILENT] * 8], [18], [True]) == [0]
    # 17 + 3 frames: the 3rd; 16 + 3 is short of the rule.
    assert ends_inside([row], [17], [True]) == [3]
    assert ends_inside([row], [16], [True]) == [0]
    # Nothing said yet: leading silence is the other rule's business.
    assert ends_inside([row], [18], [False]) == [0]


def test_text_inside_the_chunk_counts_as_said_and_restarts_the_silence() -> None:
    # Speech at frame 0, then 20 silent frames, then speech: the endpoint is at the 20th.
    row = [SPEECH] + [SILENT] * 20 + [SPEECH, SPEECH, SILENT]
    assert ends_inside([row], [0], [False]) == [21]
    # The same row with 19 silent frames: no endpoint.
    assert ends_inside([[SPEECH] + [SILENT] * 19 + [SPEECH] * 4], [0], [False]) == [0]


def test_padding_is_neither_silence_nor_speech() -> None:
    # A short last chunk of 3 real frames run at 8: the padding does not count as the speech
    # that would make a split worth it, nor as silence.
    row = [SILENT, SILENT, SPEECH] + [SILENT] * 5
    assert ends_inside([row], [18], [True], frames=[3]) == [2]
    assert ends_inside([[SILENT, SILENT, SILENT] + [SPEECH] * 5], [18], [True], frames=[3]) == [0]


def test_with_the_energy_gate_a_wavering_quiet_frame_keeps_the_pause_going() -> None:
    # 17 silent frames before the chunk; frame 1 is quiet line noise where the head wavers
    # (P(blank) 0.7, blank still its best label), then speech from frame 3.
    blank = np.array([[SILENT, 0.7, SILENT, SPEECH, SPEECH, SILENT, SILENT, SILENT]])
    nonblank = np.array([[False, False, False, True, True, False, False, False]])
    quiet = np.zeros_like(nonblank)
    args = (np.array([17]), np.array([True]), nonblank)
    assert silence_ends_inside(RULES, FRAME_MS, blank, *args).tolist() == [0]  # WeNet: the run restarts
    gate = replace(RULES, energy_gate_db=10.0)
    assert silence_ends_inside(gate, FRAME_MS, blank, *args, quiet).tolist() == [3]  # 17 + 3 = 20
    loud = quiet.copy()
    loud[0, 1] = True  # the same frame, loud: it is no pause
    assert silence_ends_inside(gate, FRAME_MS, blank, *args, loud).tolist() == [0]


def test_the_kept_frames_end_the_utterance_in_update_endpoints() -> None:
    rows = [[SILENT, SILENT, SPEECH, SPEECH], [SPEECH] * 4]
    blank = np.array(rows)
    trailing = np.array([18, 0], dtype=np.int64)
    split = silence_ends_inside(RULES, FRAME_MS, blank, trailing, np.array([True, True]), blank <= 0.8)
    assert split.tolist() == [2, 0]
    real = np.where(split > 0, split, 4)
    codes = update_endpoints(
        RULES, FRAME_MS, blank, trailing, np.array([100, 100], dtype=np.int64), np.array([True, True]), None, real
    )
    assert codes.tolist() == [TRAILING_SILENCE, 0]
    assert trailing.tolist() == [20, 0]


# -- the engine, on the bundled demo model and recordings -----------------------------------

DATA = DEMO_MODEL.parents[1] / "tests" / "data" / "hotline_8k"
SENTENCES = ("hotline_seed", "hotline_1", "hotline_2")
PAUSE_MS = 1000  # as asr-bench e2e's calls: over the 800 ms rule, under it plus a 640 ms chunk
LADDER = ((160, 8), (320, 4), (640, 2))  # the attention window kept, as surge moves calls

pytestmark_model = pytest.mark.skipif(not (DEMO_MODEL / "final.pt").is_file(), reason="no bundled demo model")


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(DEMO_MODEL)


def call(lead_ms: int) -> np.ndarray:
    """The three sentences with 1 s pauses of line noise, after ``lead_ms`` of it (which moves
    where the chunk boundaries fall in each pause), as ``endpoint_phases`` builds its calls."""
    sentences = [read_wav(DATA / f"{name}.wav").samples for name in SENTENCES]
    return endpoint_phases.call(sentences, PAUSE_MS, lead_ms, seed=lead_ms)


def finals(loaded: LoadedModel, audio: np.ndarray, chunk_ms: int, left_chunks: int, every_frame: bool) -> list[Final]:
    options = EngineOptions(max_streams=1, trim_interval_s=0)
    engine = Engine(loaded, replace(options, endpoint=replace(options.endpoint, check_every_frame=every_frame)))
    (got,) = endpoint_phases.decode(engine, [audio], chunk_ms, left_chunks)
    return got


@pytestmark_model
@pytest.mark.parametrize("lead_ms", [0, 200, 400])
def test_utterances_end_at_the_same_pauses_with_the_same_text_at_every_chunk_size(
    loaded: LoadedModel, lead_ms: int
) -> None:
    audio = call(lead_ms)
    by_size = {chunk_ms: finals(loaded, audio, chunk_ms, left, True) for chunk_ms, left in LADDER}
    for chunk_ms, got in by_size.items():
        assert len(got) == len(SENTENCES), (chunk_ms, [f.text for f in got])
        assert [f.reason for f in got[:-1]] == ["silence"] * (len(SENTENCES) - 1)
    texts = {chunk_ms: [f.text for f in got] for chunk_ms, got in by_size.items()}
    assert texts[320] == texts[160] and texts[640] == texts[160], texts
    # Each utterance begins where the one before ended, in stream time (no audio skipped or read
    # twice). An utterance ends where its pause reached the rule, or, where the pause lasted to
    # the chunk's end, at that end (the silence is the ending utterance's, as in WeNet): within
    # one chunk of each other.
    for got in by_size.values():
        assert all(b.begin_ms == a.end_ms for a, b in itertools.pairwise(got))
    for a, b in zip(by_size[160], by_size[640], strict=True):
        assert abs(a.end_ms - b.end_ms) < 640


@pytestmark_model
def test_at_chunk_ends_only_640_ms_chunks_run_sentences_together(loaded: LoadedModel) -> None:
    """WeNet's rule (``check_every_frame=False``) on the same calls: at 640 ms chunks a 1 s
    pause ends the utterance only where a chunk's end falls in its last 200 ms."""
    merged = 0
    for lead_ms in (0, 200, 400):
        audio = call(lead_ms)
        wenet = finals(loaded, audio, 640, 2, False)
        ours = finals(loaded, audio, 640, 2, True)
        assert "".join(f.text for f in wenet) == "".join(f.text for f in ours) or len(wenet) < len(ours)
        merged += len(ours) - len(wenet)
    assert merged > 0


@pytestmark_model
def test_the_endpoint_phases_bench_finds_every_pause_at_640_ms() -> None:
    """``python -m deploy.bench.endpoint_phases`` on a short call: with the rule at every frame,
    640 ms chunks end an utterance at every 900 ms pause and read as 160 ms chunks do."""
    out = endpoint_phases.run(
        argparse.Namespace(model=str(DEMO_MODEL), pause_ms=[900], phases=2, seconds=8.0, threads=1)
    )
    by = {(r["chunk_ms"], r["rule"]): r for r in out["results"]}
    assert set(by) == {(ms, rule) for ms, _ in LADDER for rule in ("chunk_ends", "every_frame")}
    assert out["pauses_per_call"] >= 1
    assert by[(640, "every_frame")]["pauses_missed"] == 0
    assert by[(640, "every_frame")]["same_text_as_160_ms_share"] == 1.0
    assert by[(640, "chunk_ends")]["endpoints_inside_chunks"] == 0


@pytestmark_model
def test_a_stream_rewinds_only_into_the_chunk_it_took_last(loaded: LoadedModel) -> None:
    engine = Engine(loaded, EngineOptions(max_streams=1, trim_interval_s=0))
    stream = engine.open_stream(StreamConfig(chunk_ms=640, left_chunks=2, stream_id="r"), lambda event: None)
    with pytest.raises(ValueError, match="cannot rewind to encoder frame 1 of a chunk of 0 fbank frames"):
        stream.rewind(1)  # no chunk taken yet
    stream.accept_waveform(call(0))
    stream.drain_inbox()
    stream.take_chunk_samples(stream.next_chunk_frames())
    assert (stream.chunk_start, stream.frames_consumed) == (0, 64)
    with pytest.raises(ValueError, match="cannot rewind"):
        stream.rewind(17)  # past the chunk's 16 encoder frames
    stream.rewind(5)
    assert stream.frames_consumed == 20
    assert stream.next_chunk_frames() == stream.window  # its frames are still held: read again
