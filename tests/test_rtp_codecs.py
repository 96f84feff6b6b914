"""The codec table (`rtp.codecs`): lookups, the C path's assumptions, and each audio codec's
encoder and decoder agreeing."""

from __future__ import annotations

import numpy as np
import pytest

from rtp.codecs import (
    CODECS,
    Codec,
    CodecKind,
    audio_codecs,
    codec,
    codec_named,
    find_codec,
    payload_type_map,
    sent_codec,
    static_codec,
)


def test_names_payload_types_and_rtpmaps_are_unique() -> None:
    assert len({c.name.upper() for c in CODECS}) == len(CODECS)
    assert len({c.payload_type for c in CODECS}) == len(CODECS)
    assert len({(c.encoding.upper(), c.clock_rate) for c in CODECS}) == len(CODECS)


def test_lookups() -> None:
    assert codec_named("pcmu") is codec("PCMU")
    assert codec_named("G729") is None
    with pytest.raises(ValueError, match=r"unknown codec 'G729'; use one of .*PCMU"):
        codec("G729")
    assert find_codec("g722", 8000) is codec("G722")
    assert find_codec("PCMU", 8000, channels=2) is None
    assert static_codec(8) is codec("PCMA")
    assert static_codec(101) is None  # dynamic: only its rtpmap names it
    assert sent_codec(101) is codec("telephone-event")
    with pytest.raises(ValueError, match="no codec is sent as payload type 127"):
        sent_codec(127)
    assert payload_type_map()[9] == "G722"


def test_the_c_path_takes_only_table_codecs_of_one_byte_per_8khz_tick() -> None:
    fast = [c for c in CODECS if c.fast_path]
    assert {c.name for c in fast} == {"PCMU", "PCMA"}
    for entry in fast:
        assert entry.decode_table is not None and entry.clock_rate == 8000
        assert (entry.frame_bytes, entry.frame_ticks) == (1, 1)


@pytest.mark.parametrize("entry", list(audio_codecs()), ids=lambda c: c.name)
def test_audio_codecs_decode_what_they_encode(entry: Codec) -> None:
    assert entry.kind is CodecKind.AUDIO and entry.sample_rate in (8000, 16000)
    assert entry.make_encoder is not None and entry.make_decoder is not None
    rate = entry.sample_rate
    tone = (np.sin(2 * np.pi * 440 * np.arange(rate // 5) / rate) * 8000).astype(np.int16)  # 200 ms
    payload = entry.make_encoder().encode(tone)
    ticks = entry.ticks(len(payload))
    assert ticks == entry.clock_rate // 5 and entry.payload_bytes(ticks) == len(payload)
    decoded = entry.make_decoder().decode(payload)
    assert decoded.dtype == np.int16 and len(decoded) == entry.samples(ticks) == len(tone)
    tone_rms = np.sqrt(np.mean(tone.astype(np.float64) ** 2))
    if entry.name == "G722":  # its output lags its input by a few samples: compare energy only
        assert 0.5 < np.sqrt(np.mean(decoded[rate // 50 :].astype(np.float64) ** 2)) / tone_rms < 2
    else:
        error = decoded.astype(np.float64) - tone
        assert np.sqrt(np.mean(error**2)) < 0.05 * tone_rms
