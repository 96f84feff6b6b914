"""The AudioSocket wire format: a 3-byte header (kind, payload length big-endian) and a payload.

Kinds, from Asterisk's ``include/asterisk/res_audiosocket.h`` and ``res/res_audiosocket.c``
(``ast_audiosocket_send_frame`` picks the audio kind by the channel's signed-linear rate):

======  ===================================================================================
0x00    hangup (no payload)
0x01    the stream's UUID (16 bytes, binary, RFC 4122 byte order): the first frame
0x03    one DTMF key (1 byte, the ASCII digit)
0x10    audio, signed linear 16-bit little-endian mono at 8 kHz (``slin``)
0x11    ... at 12 kHz; 0x12 16 kHz; 0x13 24 kHz; 0x14 32 kHz; 0x15 44.1 kHz; 0x16 48 kHz;
        0x17 96 kHz; 0x18 192 kHz (``slin12`` ... ``slin192``, Asterisk 22+)
0xff    error (an optional 1-byte code from Asterisk; our own error frames carry a reason text)
======  ===================================================================================

Sans-IO: ``FrameReader`` takes bytes as they arrive (``receive_data``) and hands back whole
frames (``next_frame``, None while more bytes are needed), ``encode`` makes the bytes of one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from audiosocket.errors import PeerError

HEADER = struct.Struct("!BH")
"""kind (1 byte), payload length in bytes (2 bytes, big-endian)."""
MAX_PAYLOAD_BYTES = 0xFFFF
"""The header's length field cannot say more."""


class Kind(IntEnum):
    HANGUP = 0x00
    UUID = 0x01
    DTMF = 0x03
    AUDIO = 0x10
    AUDIO_12K = 0x11
    AUDIO_16K = 0x12
    AUDIO_24K = 0x13
    AUDIO_32K = 0x14
    AUDIO_44K = 0x15
    AUDIO_48K = 0x16
    AUDIO_96K = 0x17
    AUDIO_192K = 0x18
    ERROR = 0xFF


AUDIO_RATES: dict[Kind, int] = {
    Kind.AUDIO: 8_000,
    Kind.AUDIO_12K: 12_000,
    Kind.AUDIO_16K: 16_000,
    Kind.AUDIO_24K: 24_000,
    Kind.AUDIO_32K: 32_000,
    Kind.AUDIO_44K: 44_100,
    Kind.AUDIO_48K: 48_000,
    Kind.AUDIO_96K: 96_000,
    Kind.AUDIO_192K: 192_000,
}
"""Sample rate (Hz) of each audio kind."""
_KINDS = {int(kind) for kind in Kind}


@dataclass(frozen=True, slots=True)
class Frame:
    kind: Kind
    payload: bytes

    def __bytes__(self) -> bytes:
        return encode(self.kind, self.payload)


def encode(kind: Kind, payload: bytes = b"") -> bytes:
    """The bytes of one frame; ValueError when the payload is longer than the header can say."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"AudioSocket payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    return HEADER.pack(kind, len(payload)) + payload


class FrameReader:
    """Whole frames out of a byte stream cut anywhere.

    ``max_payload_bytes`` bounds what one frame may announce: a longer one raises ``PeerError``
    (reason ``oversized``) as soon as its header is read, before its payload is buffered. An
    unknown kind raises ``PeerError`` (reason ``unknown_kind``). After an error the reader is
    of no further use: the connection is closed.
    """

    def __init__(self, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> None:
        self.max_payload_bytes = max_payload_bytes
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as a frame."""
        return len(self._buffer)

    def receive_data(self, data: bytes) -> None:
        self._buffer += data

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until more bytes arrive."""
        if len(self._buffer) < HEADER.size:
            return None
        kind, length = HEADER.unpack_from(self._buffer)
        if kind not in _KINDS:
            raise PeerError("unknown_kind", f"unknown AudioSocket frame kind 0x{kind:02x}")
        if length > self.max_payload_bytes:
            raise PeerError(
                "oversized", f"AudioSocket frame of {length} bytes exceeds the limit of {self.max_payload_bytes}"
            )
        end = HEADER.size + length
        if len(self._buffer) < end:
            return None
        payload = bytes(self._buffer[HEADER.size : end])
        del self._buffer[:end]
        return Frame(Kind(kind), payload)
