"""The codec table: every RTP payload format we take, in one place.

SDP negotiation (`sip.sdp`: which codecs we accept, answer and offer, in which order), the leg
(`rtp.leg`, `rtp.decoding`: how a payload becomes PCM), the C receive path (which codecs it
may take) and the test senders and benchmarks (how PCM becomes a payload) all read `CODECS`.
Adding a codec is one `Codec` entry here with its decoder (and an encoder for the senders).

Units: an RTP payload is whole *frames* of `frame_bytes` bytes, each `frame_ticks` ticks of
the RTP clock (`clock_rate`, Hz); the decoder turns it into int16 PCM at `sample_rate` Hz.
G.711 is 1 byte per tick at 8 kHz; G.722 keeps RFC 3551's quirk of an 8 kHz clock for audio
sampled at 16 kHz (1 byte per tick, 2 samples per tick); L16 is 2 bytes per tick, one sample
per tick at its own clock.

Payload-type maps (`{96: "PCMU"}`, what an SDP plan hands the leg) name codecs by `Codec.name`,
case-insensitively.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rtp import g711
from rtp.g722 import G722Decoder, G722Encoder
from rtp.l16 import L16Decoder, L16Encoder

DYNAMIC_PAYLOAD_TYPES = range(96, 128)
"""RFC 3551: payload type numbers bound by an SDP rtpmap line, not by the static table."""


class Decoder(Protocol):
    """One stream's decoder: payloads in sequence order -> int16 PCM, shape (samples,), at the
    codec's `sample_rate`. May keep state between payloads (ADPCM predictors)."""

    def decode(self, payload: bytes) -> np.ndarray: ...


class Encoder(Protocol):
    """One stream's encoder (test senders, benchmarks): int16 PCM at the codec's `sample_rate`,
    shape (samples,) -> payload bytes."""

    def encode(self, pcm: np.ndarray) -> bytes: ...


class CodecKind(enum.Enum):
    AUDIO = "audio"
    COMFORT_NOISE = "comfort-noise"
    """RFC 3389: the sender is silent; never decoded, anchors silence until the next packet."""
    EVENTS = "events"
    """RFC 4733 telephone-events: key presses, never audio (`rtp.dtmf`)."""


class TableDecoder:
    """A stateless byte -> sample lookup (G.711)."""

    __slots__ = ("table",)

    def __init__(self, table: np.ndarray) -> None:
        self.table = table

    def decode(self, payload: bytes) -> np.ndarray:
        return self.table.take(np.frombuffer(payload, dtype=np.uint8))


class TableEncoder:
    """A stateless sample -> byte lookup, indexed by the int16 sample viewed as uint16 (G.711)."""

    __slots__ = ("_table",)

    def __init__(self, table: np.ndarray) -> None:
        self._table = table

    def encode(self, pcm: np.ndarray) -> bytes:
        index = np.ascontiguousarray(pcm, dtype=np.int16).view(np.uint16)
        data: bytes = self._table[index].tobytes()
        return data


@dataclass(frozen=True, slots=True, eq=False)
class Codec:
    """One RTP payload format; each is one entry of `CODECS`, equal only to itself."""

    name: str
    """Unique in `CODECS`, as payload-type maps and `call.started` events name it."""
    encoding: str
    """The SDP rtpmap encoding name (RFC 4566), matched case-insensitively."""
    clock_rate: int
    """RTP timestamp ticks per second, as the rtpmap says it."""
    payload_type: int
    """The static payload type (RFC 3551), or for a dynamic codec the number our own offers
    and our test senders give it."""
    kind: CodecKind = CodecKind.AUDIO
    sample_rate: int = 0
    """Hz of the PCM the decoder yields (audio only): 8000 (resampled to 16 kHz for the engine)
    or 16000 (handed on as it is), the two rates `rtp.decoding` takes."""
    frame_bytes: int = 1
    frame_ticks: int = 1
    make_decoder: Callable[[], Decoder] | None = None
    make_encoder: Callable[[], Encoder] | None = None
    decode_table: np.ndarray | None = None
    """A stateless byte -> int16 table, when the codec is one: payloads of several packets are
    then decoded together, and the shared upsampler decodes them itself (`rtp.resample`)."""
    fast_path: bool = False
    """Whether the C receive path (`rtp._fastrtp`) may take this codec's in-order packets: it
    assumes 1 byte per tick of an 8 kHz clock and hands over the payload bytes undecoded, for
    `decode_table`."""

    @property
    def dynamic(self) -> bool:
        """Whether SDP names it by an rtpmap line only (no static payload type)."""
        return self.payload_type in DYNAMIC_PAYLOAD_TYPES

    @property
    def rtpmap(self) -> str:
        """The rtpmap value without the payload type: ``L16/16000``."""
        return f"{self.encoding}/{self.clock_rate}"

    def ticks(self, payload_bytes: int) -> int:
        """RTP clock ticks a payload of `payload_bytes` bytes lasts."""
        return payload_bytes * self.frame_ticks // self.frame_bytes

    def payload_bytes(self, ticks: int) -> int:
        """Bytes of a payload lasting `ticks` RTP clock ticks (whole frames)."""
        return ticks // self.frame_ticks * self.frame_bytes

    def samples(self, ticks: int) -> int:
        """Decoded samples (at `sample_rate`) of `ticks` RTP clock ticks."""
        return ticks * self.sample_rate // self.clock_rate


def _g711(name: str, payload_type: int) -> Codec:
    table = g711.DECODE_TABLES[name]
    encode_table = g711.ENCODE_TABLES[name]
    return Codec(
        name, name, 8000, payload_type, sample_rate=8000,
        make_decoder=lambda: TableDecoder(table), make_encoder=lambda: TableEncoder(encode_table),
        decode_table=table, fast_path=True,
    )  # fmt: skip


def _l16(clock_rate: int, payload_type: int) -> Codec:
    return Codec(
        f"L16/{clock_rate}", "L16", clock_rate, payload_type, sample_rate=clock_rate, frame_bytes=2,
        make_decoder=L16Decoder, make_encoder=L16Encoder,
    )  # fmt: skip


CODECS: tuple[Codec, ...] = (
    Codec("G722", "G722", 8000, 9, sample_rate=16000, make_decoder=G722Decoder, make_encoder=G722Encoder),
    _g711("PCMU", 0),
    _g711("PCMA", 8),
    _l16(16000, 96),
    _l16(8000, 97),
    Codec("telephone-event", "telephone-event", 8000, 101, CodecKind.EVENTS),
    Codec("telephone-event/16000", "telephone-event", 16000, 102, CodecKind.EVENTS),
    Codec("CN", "CN", 8000, 13, CodecKind.COMFORT_NOISE),
)
"""Every payload format we take. SDP answers prefer the audio codec of the highest
`sample_rate` offered, and among those the offerer's first; our own offers list the audio
codecs in this order, then telephone-event at both clocks (RFC 4733: events count in the clock
of the audio they go with)."""

_BY_NAME = {entry.name.upper(): entry for entry in CODECS}
_BY_RTPMAP = {(entry.encoding.upper(), entry.clock_rate): entry for entry in CODECS}
_BY_STATIC_TYPE = {entry.payload_type: entry for entry in CODECS if not entry.dynamic}


def codec_named(name: str) -> Codec | None:
    """The codec a payload-type map names (``"pcmu"``, ``"L16/16000"``), None for one we do not take."""
    return _BY_NAME.get(name.upper())


def codec(name: str) -> Codec:
    """The codec named `name` (case-insensitive); ValueError naming those we take otherwise."""
    found = _BY_NAME.get(name.upper())
    if found is None:
        raise ValueError(f"unknown codec {name!r}; use one of {', '.join(c.name for c in CODECS)}")
    return found


def find_codec(encoding: str, clock_rate: int, channels: int = 1) -> Codec | None:
    """The codec of an SDP rtpmap (``L16``, 16000, 1), None for one we do not take (any
    multi-channel one)."""
    if channels != 1:
        return None
    return _BY_RTPMAP.get((encoding.upper(), clock_rate))


def static_codec(payload_type: int) -> Codec | None:
    """The codec a static payload type (RFC 3551) stands for without an rtpmap, if we take it."""
    return _BY_STATIC_TYPE.get(payload_type)


def sent_codec(payload_type: int) -> Codec:
    """The codec our test senders and benchmarks send as `payload_type` (its static number, or
    the number our offers give a dynamic codec); ValueError for another number."""
    for entry in CODECS:
        if entry.payload_type == payload_type:
            return entry
    numbers = ", ".join(f"{c.payload_type} ({c.name})" for c in CODECS)
    raise ValueError(f"no codec is sent as payload type {payload_type}; use one of {numbers}")


def telephone_events(audio: Codec) -> Codec:
    """The RFC 4733 events that go with `audio` (at its RTP clock, as RFC 4733 2.1 asks);
    ValueError when the table has none at that clock."""
    events = _BY_RTPMAP.get(("TELEPHONE-EVENT", audio.clock_rate))
    if events is None:
        raise ValueError(f"no telephone-event at {audio.clock_rate} Hz in rtp.codecs to go with {audio.name}")
    return events


def audio_codecs() -> Iterator[Codec]:
    """The audio codecs, in table order."""
    return (entry for entry in CODECS if entry.kind is CodecKind.AUDIO)


def payload_type_map() -> dict[int, str]:
    """Every codec under the payload type our offers give it: {9: "G722", 0: "PCMU", ...}."""
    return {entry.payload_type: entry.name for entry in CODECS}
