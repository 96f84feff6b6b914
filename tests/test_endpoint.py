"""WeNet's CTC endpoint rules, vectorized over a batch."""

from __future__ import annotations

import numpy as np

from asr_core.endpoint import (
    LEADING_SILENCE,
    MAX_LENGTH,
    NO_ENDPOINT,
    TRAILING_SILENCE,
    EndpointRules,
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
    return update_endpoints(
        RULES, FRAME_MS, np.array(prob_rows), trailing, utt_frames, np.array(decoded, dtype=bool)
    )


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
