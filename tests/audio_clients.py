"""Door clients for the end-to-end tests, each written from its protocol's public description
(not from our server code), and the bundled recording as they send it.

AudioSocket (Asterisk's ``res_audiosocket``, docs.asterisk.org "AudioSocket"): TCP; each
message is a 1-byte type, a 2-byte big-endian payload length and the payload; the UUID (0x01,
16 bytes) first, then signed-linear little-endian audio (0x10 at 8 kHz, 0x12 at 16 kHz) in
20 ms frames, DTMF (0x03, one ASCII digit), hangup (0x00, empty).

WebSocket clients use ``websocket-client`` (PyPI ``websocket-client``, an independent
implementation of RFC 6455; synchronous, so tests run them in threads):

- WeNet runtime (``runtime/core/websocket``, its README and client): text start signal
  ``{"signal": "start", "nbest": N, "continuous_decoding": true}``, binary 16 kHz 16-bit PCM,
  ``{"signal": "end"}``; replies ``server_ready``, ``partial_result``, ``final_result`` (``nbest``
  a JSON string of sentences), ``speech_end``;
- hotline-asr's own dialect (docs/front-doors.md): subprotocol ``hotline-asr.v1``, the start
  signal names ``sample_rate``, ``chunk_ms``, ``left_chunks``; replies our event JSON;
- FreeSWITCH ``mod_audio_fork`` (its README): subprotocol ``audio.drachtio.org``, one text
  frame of metadata JSON first, then binary L16 frames (``stereo``: two channels interleaved),
  the fork's end closes the socket.
"""

from __future__ import annotations

import asyncio
import json
import struct
import uuid
import wave
from pathlib import Path

import numpy as np
import websocket

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


def _chunks(pcm: np.ndarray, samples: int) -> list[bytes]:
    data = pcm.astype("<i2").tobytes()
    return [data[i : i + 2 * samples] for i in range(0, len(data), 2 * samples)]


def wenet_client(url: str, pcm16k: np.ndarray, nbest: int = 1) -> list[dict[str, object]]:
    """WeNet's protocol: start, 100 ms binary chunks, end; every reply up to ``speech_end``."""
    ws = websocket.create_connection(url, timeout=120)
    try:
        ws.send(json.dumps({"signal": "start", "nbest": nbest, "continuous_decoding": True}))
        replies = [json.loads(ws.recv())]
        for chunk in _chunks(pcm16k, 1600):
            ws.send_binary(chunk)
        ws.send(json.dumps({"signal": "end"}))
        while replies[-1].get("type") != "speech_end":
            replies.append(json.loads(ws.recv()))
        return replies
    finally:
        ws.close()


def hotline_client(url: str, pcm: np.ndarray, rate: int, chunk_ms: int, left_chunks: int) -> list[dict[str, object]]:
    """Our dialect: a start naming rate and chunking, 20 ms binary frames, end; every reply (the
    ``server_ready``, then events) up to ``call.ended``."""
    ws = websocket.create_connection(url, timeout=120, subprotocols=["hotline-asr.v1"])
    try:
        start = {"signal": "start", "sample_rate": rate, "chunk_ms": chunk_ms, "left_chunks": left_chunks}
        ws.send(json.dumps(start))
        replies = [json.loads(ws.recv())]
        for chunk in _chunks(pcm, rate // 50):
            ws.send_binary(chunk)
        ws.send(json.dumps({"signal": "end"}))
        while replies[-1].get("event_type") != "call.ended":
            replies.append(json.loads(ws.recv()))
        return replies
    finally:
        ws.close()


def audio_fork_client(
    url: str, metadata: dict[str, str], channels: list[np.ndarray], rate: int, *, await_final: bool = False
) -> list[dict[str, object]]:
    """mod_audio_fork: metadata text frame, 20 ms L16 frames (channels interleaved), close.
    With ``await_final``, read the server's text frames until a final arrives before closing."""
    ws = websocket.create_connection(url, timeout=120, subprotocols=["audio.drachtio.org"])
    replies: list[dict[str, object]] = []
    try:
        ws.send(json.dumps(metadata))
        length = max(len(c) for c in channels)
        frames = np.zeros((length, len(channels)), dtype=np.int16)  # (samples, channels)
        for i, channel in enumerate(channels):
            frames[: len(channel), i] = channel
        for chunk in _chunks(frames.reshape(-1), len(channels) * rate // 50):
            ws.send_binary(chunk)
        while await_final and not any(r.get("event_type") == "transcript.final" for r in replies):
            replies.append(json.loads(ws.recv()))
        return replies
    finally:
        ws.close()
