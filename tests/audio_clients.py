"""Door clients for the end-to-end tests, each written from its protocol's public description
(not from our server code), and the bundled recording as they send it.

AudioSocket (Asterisk's ``res_audiosocket``, docs.asterisk.org "AudioSocket"): TCP; each
message is a 1-byte type, a 2-byte big-endian payload length and the payload; the UUID (0x01,
16 bytes) first, then signed-linear little-endian audio (0x10 at 8 kHz, 0x12 at 16 kHz) in
20 ms frames, DTMF (0x03, one ASCII digit), hangup (0x00, empty).
"""

from __future__ import annotations

import asyncio
import struct
import uuid
import wave
from pathlib import Path

import numpy as np

from rtp.resample import upsample_recording

DATA = Path(__file__).resolve().parent / "data" / "hotline_8k"


def recording(name: str, rate: int) -> np.ndarray:
    """The bundled recording ``name`` as int16 PCM at ``rate`` (8000: the file as is; 16000: as a
    wideband peer hears it, upsampled like a call's leg)."""
    with wave.open(str(DATA / f"{name}.wav"), "rb") as wav:
        assert wav.getframerate() == 8000 and wav.getsampwidth() == 2
        pcm8k = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16)
    if rate == 8000:
        return pcm8k
    return np.clip(np.round(upsample_recording(pcm8k)), -32768, 32767).astype(np.int16)


def audiosocket_message(kind: int, payload: bytes = b"") -> bytes:
    return struct.pack("!BH", kind, len(payload)) + payload


async def audiosocket_call(
    port: int, stream: uuid.UUID, pcm: np.ndarray, rate: int, keys: str = "", *, hang_up: bool = True
) -> bytes:
    """Stream ``pcm`` (int16 at ``rate``) as Asterisk's AudioSocket() does, then key in ``keys`` and
    hang up (or just close); what the server sent back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    kind = {8000: 0x10, 16000: 0x12}[rate]
    frame = rate // 50  # 20 ms
    writer.write(audiosocket_message(0x01, stream.bytes))
    data = pcm.astype("<i2").tobytes()
    for i, start in enumerate(range(0, len(data), 2 * frame)):
        writer.write(audiosocket_message(kind, data[start : start + 2 * frame]))
        if i % 50 == 49:  # a second of audio at a time
            await writer.drain()
            await asyncio.sleep(0.01)
    for key in keys:
        writer.write(audiosocket_message(0x03, key.encode("ascii")))
    if hang_up:
        writer.write(audiosocket_message(0x00))
    else:
        writer.write_eof()
    await writer.drain()
    reply = await reader.read()
    writer.close()
    return reply
