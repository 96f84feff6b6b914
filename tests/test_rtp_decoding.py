"""The decode-and-batch stage of a leg (`rtp.decoding.AudioDecoding`), without sockets: frames
in, PCM batches out, with the codecs of `rtp.codecs`."""

from __future__ import annotations

import numpy as np
import pytest

from rtp.codecs import codec
from rtp.decoding import AudioDecoding
from rtp.jitter import Frame, FrameKind

PCMU, G722 = codec("PCMU"), codec("G722")


def tone(rate: int, seconds: float) -> np.ndarray:
    return (np.sin(2 * np.pi * 440 * np.arange(int(rate * seconds)) / rate) * 8000).astype(np.int16)


def collect(batch_ms: int = 80, resampler: str = "none") -> tuple[AudioDecoding, list[np.ndarray]]:
    out: list[np.ndarray] = []
    return AudioDecoding(out.append, resampler=resampler, batch_ms=batch_ms), out


def test_g711_is_decoded_in_batches_and_silence_fills_gaps() -> None:
    decoding, out = collect()
    decoding.set_codecs({0: PCMU})
    assert PCMU.make_encoder is not None
    payload = PCMU.make_encoder().encode(tone(8000, 0.2))
    packets = [payload[i : i + 160] for i in range(0, len(payload), 160)]
    for packet in packets[:3]:
        decoding.play_in_order(PCMU, 0, packet)
    assert out == []  # 60 ms: the 80 ms batch is not full yet
    decoding.play([Frame(FrameKind.SILENCE, 0, b"", 160), Frame(FrameKind.AUDIO, 0, packets[3], 160)])
    assert [len(piece) for piece in out] == [800]
    decoding.play([Frame(FrameKind.AUDIO, 7, b"\x00" * 160, 160)])  # a payload type no longer known: silence
    decoding.flush()
    pcm = np.concatenate(out)
    assert len(pcm) == 960
    assert PCMU.make_decoder is not None
    expected = PCMU.make_decoder().decode(b"".join(packets[:3]))
    np.testing.assert_array_equal(pcm[:480], expected)
    assert not pcm[480:640].any() and not pcm[800:].any()


def test_wideband_audio_goes_out_at_16khz_and_its_silence_counts_ticks_twice() -> None:
    decoding, out = collect(batch_ms=0, resampler="halfband")
    decoding.set_codecs({9: G722})
    assert G722.make_encoder is not None
    payload = G722.make_encoder().encode(tone(16000, 0.04))  # 640 samples, 320 ticks
    decoding.play([Frame(FrameKind.AUDIO, 9, payload[:160], 160), Frame(FrameKind.SILENCE, 9, b"", 160)])
    decoding.flush()
    (pcm,) = out  # one play() call, one batch
    assert len(pcm) == 640 and pcm[:320].any() and not pcm[320:].any()


@pytest.mark.parametrize("switch", [False, True])
def test_a_codec_switch_or_a_new_stream_starts_a_fresh_stateful_decoder(switch: bool) -> None:
    decoding, out = collect(batch_ms=0, resampler="halfband")
    decoding.set_codecs({9: G722})
    assert G722.make_encoder is not None
    payload = G722.make_encoder().encode(tone(16000, 0.02))
    decoding.play_in_order(G722, 9, payload)
    assert decoding.stateful
    if switch:
        decoding.set_codecs({9: G722, 0: PCMU})
    else:
        decoding.new_stream()
    decoding.play_in_order(G722, 9, payload)
    decoding.flush()
    first, second = out
    np.testing.assert_array_equal(first, second)  # same payload from the same (fresh) state


def test_the_same_map_keeps_the_decoder_state() -> None:
    decoding, out = collect(batch_ms=0, resampler="halfband")
    decoding.set_codecs({9: G722})
    assert G722.make_encoder is not None
    payload = G722.make_encoder().encode(tone(16000, 0.02))
    decoding.play_in_order(G722, 9, payload)
    decoding.set_codecs({9: G722})
    decoding.play_in_order(G722, 9, payload)
    first, second = out
    assert not np.array_equal(first, second)
