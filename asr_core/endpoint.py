"""CTC endpoint detection (WeNet's rules), vectorized over a batch of streams.

A frame is silence when P(blank) > ``blank_threshold``. An utterance ends when
1. nothing has been decoded and the silence reaches ``leading_silence_ms`` (the utterance is
   dropped without a final: the caller has not said anything),
2. something has been decoded and the trailing silence reaches ``trailing_silence_ms``,
3. the utterance reaches ``max_utterance_ms``.
Counting is in encoder frames (40 ms each with 4x subsampling of 10 ms fbank frames).

WeNet's runtime checks rule 2 at chunk ends only, so a pause that reaches ``trailing_silence_ms``
inside a chunk and gives way to speech before the chunk's end goes unnoticed: at 640 ms chunks
most 1 s pauses do, and sentences run together into one utterance. With
``check_every_frame`` (the service's default, ``engine.endpoint.check_every_frame``; the
library's stays WeNet's) the rule holds at every frame instead:
:func:`silence_ends_inside` finds where such a pause reached the rule, the utterance ends there,
and the engine reads the rest of the chunk again as the start of the next utterance
(``Stream.rewind``), so where utterances end no longer depends on the chunk size.

``energy_gate_db`` > 0 lets the audio decide between pause and speech (not in WeNet): a frame
counts as silence when its audio is quiet, less than that many dB above the stream's noise
floor (see :func:`loud_frames`), and the model hears no token in it (its best label is blank,
whatever P(blank)). A CTC head that stops emitting in the middle of speech (a weak model, or
speech it cannot transcribe) then no longer cuts the utterance there, and one frame of line
noise where the head wavers (P(blank) 0.7: still blank, below the threshold) no longer restarts
a pause's count, which at 160 ms chunks ran two sentences together. The default, 0, is WeNet's
rule alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NO_ENDPOINT = 0
LEADING_SILENCE = 1
TRAILING_SILENCE = 2
MAX_LENGTH = 3
REASONS = {LEADING_SILENCE: "leading_silence", TRAILING_SILENCE: "silence", MAX_LENGTH: "max_length"}


@dataclass(frozen=True, slots=True)
class EndpointRules:
    blank_threshold: float = 0.8
    trailing_silence_ms: int = 800
    leading_silence_ms: int = 5000
    max_utterance_ms: int = 20000
    energy_gate_db: float = 0.0  # > 0: silence is quiet audio (this close to the noise floor) with blank best
    check_every_frame: bool = False  # True: rule 2 at every frame, not at chunk ends only (WeNet)


NOISE_FLOOR_RISE_DB = 0.1
"""How fast a stream's noise floor follows the audio up, per encoder frame (2.5 dB/s at 40 ms)."""
_NATS_PER_DB = math.log(10.0) / 10.0  # fbank energies are natural logs of power


def loud_frames(
    frame_energy: np.ndarray, floors: np.ndarray, margin_db: float, frames: np.ndarray | None = None
) -> np.ndarray:
    """Which frames are louder than the noise floor by ``margin_db`` or more.

    frame_energy: (B, C) log power of each new encoder frame's audio (natural log, as fbank).
    floors: (B,) each stream's noise floor, updated IN PLACE (``inf`` for a new stream): it
    drops at once to a quieter frame and rises by ``NOISE_FLOOR_RISE_DB`` per frame, so it
    follows the quiet stretches between words and ignores speech.
    frames: (B,) int64 real frames of each row, the rest padding (a short last chunk run at its
    full shape) that neither moves the floor nor is loud; None: all C.
    Returns (B, C) bool.
    """
    loud = np.zeros(frame_energy.shape, dtype=bool)
    rise = NOISE_FLOOR_RISE_DB * _NATS_PER_DB
    margin = margin_db * _NATS_PER_DB
    for j in range(frame_energy.shape[1]):
        real = slice(None) if frames is None else frames > j  # (B,) rows whose frame j is real
        floors[real] = np.minimum(frame_energy[real, j], floors[real] + rise)
        loud[real, j] = frame_energy[real, j] >= floors[real] + margin
    return loud


def trailing_silence_run(silent: np.ndarray) -> np.ndarray:
    """Length of the run of silent frames at the end of each row.

    silent: (B, C) bool. Returns (B,) int64; C where the whole row is silent.
    """
    _batch, frames = silent.shape
    speech = ~silent
    any_speech = speech.any(axis=1)
    # Index of the last speech frame per row (reverse argmax finds the first True from the end).
    last_speech = frames - 1 - np.argmax(speech[:, ::-1], axis=1)
    return np.where(any_speech, frames - 1 - last_speech, frames).astype(np.int64)


def silent_frames(
    rules: EndpointRules,
    blank_prob: np.ndarray,
    loud: np.ndarray | None,
    frames: np.ndarray | None,
    nonblank: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """What counts as silence, for both rules that read it: (B, C) bool, and (B,) int64, the real
    frames of each row (``frames``, or all C). Without ``loud`` (WeNet's rule), the frames whose
    P(blank) exceeds ``blank_threshold``; with it (the energy gate), the frames whose audio is not
    loud and whose P(blank) exceeds the threshold or, given ``nonblank``, whose best label is
    blank. Arguments as for :func:`update_endpoints`."""
    silent = blank_prob > rules.blank_threshold  # (B, C)
    if loud is not None:
        if nonblank is not None:
            silent |= ~nonblank
        silent &= ~loud
    real = np.full(silent.shape[0], silent.shape[1], dtype=np.int64) if frames is None else frames  # (B,)
    return silent, real


def update_endpoints(
    rules: EndpointRules,
    frame_ms: int,
    blank_prob: np.ndarray,
    trailing_frames: np.ndarray,
    utterance_frames: np.ndarray,
    decoded_any: np.ndarray,
    loud: np.ndarray | None = None,
    frames: np.ndarray | None = None,
    nonblank: np.ndarray | None = None,
) -> np.ndarray:
    """Advance the per-stream counters by one chunk and say which streams hit an endpoint.

    blank_prob: (B, C) probability of blank per new frame.
    trailing_frames, utterance_frames: (B,) int64 counters, updated IN PLACE.
    decoded_any: (B,) bool, True once the utterance has a non-blank token (after this chunk).
    loud: (B, C) bool, frames whose audio is loud (:func:`loud_frames`); they never count as
    silence. None: WeNet's rule alone.
    frames: (B,) int64 real frames of each row, the rest padding that counts for nothing (a
    short last chunk run at its full shape); None: all C.
    nonblank: (B, C) bool, frames whose best label is not blank; with ``loud``, a quiet frame
    whose best label is blank is silence whatever its P(blank) (:func:`silent_frames`).
    Returns (B,) int8 endpoint codes (NO_ENDPOINT, LEADING_SILENCE, TRAILING_SILENCE, MAX_LENGTH).
    """
    silent, real = silent_frames(rules, blank_prob, loud, frames, nonblank)
    chunk = silent.shape[1]
    padding = chunk - real  # (B,) trailing frames of each row that are padding
    silent |= np.arange(chunk)[None, :] >= real[:, None]  # padding ends every row's silent run...
    run = trailing_silence_run(silent) - padding  # ...and is taken off it again
    all_silent = run == real
    trailing_frames[:] = np.where(all_silent, trailing_frames + real, run)
    utterance_frames += real
    trailing_ms = trailing_frames * frame_ms
    codes = np.full(trailing_frames.shape, NO_ENDPOINT, dtype=np.int8)
    codes[(~decoded_any) & (trailing_ms >= rules.leading_silence_ms)] = LEADING_SILENCE
    codes[decoded_any & (trailing_ms >= rules.trailing_silence_ms)] = TRAILING_SILENCE
    codes[(codes == NO_ENDPOINT) & (utterance_frames * frame_ms >= rules.max_utterance_ms)] = MAX_LENGTH
    return codes


def silence_ends_inside(
    rules: EndpointRules,
    frame_ms: int,
    blank_prob: np.ndarray,
    trailing_frames: np.ndarray,
    had_tokens: np.ndarray,
    nonblank: np.ndarray,
    loud: np.ndarray | None = None,
    frames: np.ndarray | None = None,
) -> np.ndarray:
    """Where the trailing-silence rule was met inside each row's chunk although speech follows
    before the chunk's end (so :func:`update_endpoints`, at the chunk's end, does not see it).

    blank_prob: (B, C) probability of blank per new frame; trailing_frames: (B,) silent frames
    before the chunk (not changed); had_tokens: (B,) bool, the utterance had text before the
    chunk; nonblank: (B, C) bool, frames whose best label is not blank (text from there on,
    and, with ``loud``, what is not silence: :func:`silent_frames`);
    loud, frames: as for :func:`update_endpoints`.
    Returns (B,) int64: the frames of the chunk that belong to the ending utterance, up to and
    including the one where the silence reached the rule; 0 where the rule was not met inside.
    Feeding :func:`update_endpoints` these as the rows' ``frames`` then ends those utterances.
    """
    silent, real = silent_frames(rules, blank_prob, loud, frames, nonblank)
    chunk = silent.shape[1]
    need = max(1, math.ceil(rules.trailing_silence_ms / frame_ms))  # silent frames that end an utterance
    run = trailing_frames.astype(np.int64)
    decoded = had_tokens.astype(bool)
    split = np.zeros(silent.shape[0], dtype=np.int64)
    for j in range(chunk):
        kept = real > j  # (B,) rows whose frame j is real
        decoded = decoded | (nonblank[:, j] & kept)
        run = np.where(kept, np.where(silent[:, j], run + 1, 0), run)
        split[(split == 0) & kept & decoded & (run >= need)] = j + 1
    # Nothing but silence after it: the rule at the chunk's end ends it there, as in WeNet.
    index = np.arange(chunk)[None, :]
    last_speech = np.where(~silent & (index < real[:, None]), index, -1).max(axis=1)  # (B,)
    split[last_speech < split] = 0
    return split
