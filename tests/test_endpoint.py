"""WeNet's CTC endpoint rules, vectorized over a batch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from asr_core.endpoint import (
    LEADING_SILENCE,
    MAX_LENGTH,
    NO_ENDPOINT,
    NOISE_FLOOR_RISE_DB,
    TRAILING_SILENCE,
    EndpointRules,
    loud_frames,
    trailing_silence_run,
    update_endpoints,
)

RULES = EndpointRules(blank_threshold=0.8, trailing_silence_ms=800, leading_silence_ms=5000, max_utterance_ms=20000)
FRAME_MS = 40


def test_trailing_silence_run() -> None:
    silent = np.array(
        [[True, True, True, True], [False, True, True, True], [True, True, True, False], [True, False, True, True]]
    )
    assert trailing_silence_run(silent).tolist() == [4, 3, 0, 2]


def feed(prob_rows: list[list[float]], decoded: list[bool], state: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    trailing, utt_frames = state
    return update_endpoints(RULES, FRAME_MS, np.array(prob_rows), trailing, utt_frames, np.array(decoded, dtype=bool))


def test_trailing_silence_after_speech_ends_the_utterance() -> None:
    state = (np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64))
    # Stream 0 speaks then falls silent; stream 1 keeps speaking.
    assert feed([[0.1, 0.9, 0.9, 0.9], [0.1, 0.1, 0.1, 0.1]], [True, True], state).tolist() == [0, 0]
    codes = [feed([[0.95] * 4, [0.1] * 4], [True, True], state) for _ in range(4)]
    # 3 + 4*4 = 19 silent frames = 760 ms: not yet; one more chunk crosses 800 ms.
    assert all((c == NO_ENDPOINT).all() for c in codes)
    assert feed([[0.95] * 4, [0.1] * 4], [True, True], state).tolist() == [TRAILING_SILENCE, NO_ENDPOINT]
    assert state[0].tolist() == [23, 0]


def test_leading_silence_needs_five_seconds_without_text() -> None:
    state = (np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    results = [feed([[0.99] * 4], [False], state)[0] for _ in range(32)]  # 128 frames = 5.12 s
    first = results.index(LEADING_SILENCE)
    assert (first + 1) * 4 * FRAME_MS >= 5000 > first * 4 * FRAME_MS
    assert all(code == NO_ENDPOINT for code in results[:first])


def test_silence_without_text_is_not_a_trailing_endpoint() -> None:
    state = (np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    assert all(feed([[0.99] * 4], [False], state)[0] == NO_ENDPOINT for _ in range(10))


def test_max_utterance_length() -> None:
    state = (np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    codes = [feed([[0.1] * 16], [True], state)[0] for _ in range(32)]  # 16 frames = 640 ms each
    first = codes.index(MAX_LENGTH)
    assert (first + 1) * 640 >= 20000 > first * 640


def db(value: float) -> float:
    """dB as the natural-log power units of fbank energies."""
    return value * math.log(10.0) / 10.0


def test_noise_floor_follows_the_quiet_frames_and_rises_slowly() -> None:
    floors = np.array([math.inf, db(-40.0)])
    energy = np.array([[db(-50.0), db(-20.0), db(-49.0)], [db(-60.0), db(-60.0), db(-10.0)]])
    loud = loud_frames(energy, floors, margin_db=10.0)
    # Stream 0: the first frame sets the floor; speech 30 dB above it is loud; a frame 1 dB
    # above the floor is not, and the floor rose by NOISE_FLOOR_RISE_DB per frame meanwhile.
    assert loud.tolist() == [[False, True, False], [False, False, True]]
    assert floors[0] == pytest.approx(db(-50.0 + 2 * NOISE_FLOOR_RISE_DB))
    # Stream 1: the floor drops at once to the quieter audio.
    assert floors[1] == pytest.approx(db(-60.0 + NOISE_FLOOR_RISE_DB))


def test_a_floor_that_rises_into_long_speech_stops_calling_it_loud() -> None:
    floors = np.array([db(-60.0)])
    frames = int(30 / NOISE_FLOOR_RISE_DB) + 10  # the floor climbs 30 dB in this many frames
    loud = loud_frames(np.full((1, frames), db(-30.0)), floors, margin_db=10.0)
    assert loud[0, 0] and not loud[0, -1]
    assert floors[0] == pytest.approx(db(-30.0))


def test_loud_frames_never_count_as_silence() -> None:
    rules = EndpointRules(trailing_silence_ms=800, energy_gate_db=10.0)
    trailing, utt_frames = np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64)
    blank = np.full((2, 25), 0.99)  # CTC hears nothing in either stream for 1 s
    loud = np.zeros((2, 25), dtype=bool)
    loud[0, 20] = True  # but stream 0's audio is loud 200 ms before the end
    codes = update_endpoints(rules, FRAME_MS, blank, trailing, utt_frames, np.ones(2, dtype=bool), loud)
    assert codes.tolist() == [NO_ENDPOINT, TRAILING_SILENCE]
    assert trailing.tolist() == [4, 25]


def test_with_the_gate_a_quiet_frame_the_model_hears_nothing_in_is_silence() -> None:
    """One frame of line noise where the head wavers (P(blank) 0.7, still its best label) ends
    WeNet's run of silence; with the energy gate the audio decides: the pause goes on. A quiet
    frame where the head hears a token, and a loud frame, still end the run."""
    gate = EndpointRules(trailing_silence_ms=800, energy_gate_db=10.0)
    blank = np.full((4, 25), 0.99)  # 1 s after speech
    blank[:, 10] = 0.7  # one wavering frame, 600 ms before the end
    nonblank = np.zeros((4, 25), dtype=bool)
    nonblank[2, 10] = True  # row 2: the head's best label there is a token
    loud = np.zeros((4, 25), dtype=bool)
    loud[3, 10] = True  # row 3: the audio there is loud
    rows = [(RULES, None), (gate, loud), (gate, loud), (gate, loud)]  # row 0: WeNet's rule alone
    codes, runs = [], []
    for row, (rules, gate_loud) in enumerate(rows):
        trailing, utt_frames = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
        one = slice(row, row + 1)
        code = update_endpoints(
            rules, FRAME_MS, blank[one], trailing, utt_frames, np.ones(1, dtype=bool),
            None if gate_loud is None else gate_loud[one], None, nonblank[one],
        )  # fmt: skip
        codes.append(int(code[0]))
        runs.append(int(trailing[0]))
    assert codes == [NO_ENDPOINT, TRAILING_SILENCE, NO_ENDPOINT, NO_ENDPOINT]
    assert runs == [14, 25, 14, 14]
    # without the best labels the gate keeps the threshold: the wavering frame is not silence
    trailing = np.zeros(1, dtype=np.int64)
    decoded = np.ones(1, dtype=bool)
    update_endpoints(gate, FRAME_MS, blank[1:2], trailing, np.zeros(1, dtype=np.int64), decoded, loud[1:2])
    assert trailing.tolist() == [14]


@pytest.mark.parametrize("padding", [True, False], ids=["padding-blank", "padding-speech"])
def test_padded_frames_count_for_nothing(padding: bool) -> None:
    """A short last chunk run at its full shape (``frames``): whatever its padding holds, the
    counters, codes and noise floors are those of the short chunk alone."""
    rng = np.random.default_rng(3)
    short = [2, 4, 1, 8]  # real frames per row, of 8
    blank = rng.uniform(0.0, 1.0, (4, 8))
    blank[0] = [0.9, 0.95, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]  # silent real frames, then speech padding
    blank[:, 5:] = 0.99 if padding else 0.1
    energy = rng.uniform(0.0, 20.0, (4, 8))
    start_trailing = np.array([10, 0, 3, 5], dtype=np.int64)
    start_frames = np.array([30, 12, 7, 50], dtype=np.int64)
    floors = np.array([5.0, math.inf, 8.0, 2.0])
    frames = np.array(short, dtype=np.int64)

    trailing, utterance, padded_floors = start_trailing.copy(), start_frames.copy(), floors.copy()
    loud = loud_frames(energy, padded_floors, 10.0, frames)
    codes = update_endpoints(RULES, FRAME_MS, blank, trailing, utterance, np.array([True] * 4), loud, frames)
    for row, n in enumerate(short):
        alone_trailing = start_trailing[row : row + 1].copy()
        alone_frames = start_frames[row : row + 1].copy()
        alone_floor = floors[row : row + 1].copy()
        alone_loud = loud_frames(energy[row : row + 1, :n], alone_floor, 10.0)
        alone_codes = update_endpoints(
            RULES, FRAME_MS, blank[row : row + 1, :n], alone_trailing, alone_frames, np.array([True]), alone_loud
        )
        assert (trailing[row], utterance[row], codes[row]) == (alone_trailing[0], alone_frames[0], alone_codes[0])
        assert padded_floors[row] == alone_floor[0]
        assert not loud[row, n:].any()
