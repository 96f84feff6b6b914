"""The WebSocket door's dialects, sans-IO: which one a handshake asks for, what their text
messages say, what goes back, and how stereo L16 splits into legs.

=============  ===========================================  ===========================================
dialect        handshake                                    messages
=============  ===========================================  ===========================================
``wenet``      any other path, no subprotocol               WeNet runtime's: text ``{"signal": "start",
                                                            "nbest": N, "continuous_decoding": true}``,
                                                            binary 16 kHz 16-bit PCM, ``{"signal":
                                                            "end"}``; replies ``server_ready``,
                                                            ``partial_result``, ``final_result`` (their
                                                            ``nbest`` a JSON string of ``[{"sentence":
                                                            ...}]``) and ``speech_end``
``hotline``    path ``/v1/stream`` or subprotocol           ours: the start also names ``sample_rate``
               ``hotline-asr.v1``                           (8000/16000), ``chunk_ms`` and
                                                            ``left_chunks``; replies ``server_ready``,
                                                            then the call's events (``docs/events.md``)
``audio_fork`` subprotocol ``audio.drachtio.org`` or path   FreeSWITCH ``mod_audio_fork``: one text
               ``/audio_fork``; ``mix`` (mono, mixed,       frame of metadata (a JSON object), then
               stereo) and ``rate`` (8000/8k, 16000/16k)    binary L16 (stereo interleaved); replies:
               in the query or the metadata
                                                            the call's events when the route asks
=============  ===========================================  ===========================================

Query parameters of the handshake and (``audio_fork``) the metadata's scalar values are the
stream's attributes: what the routes file's ``headers`` conditions match and its
``metadata_headers`` publish. ``token`` is never one of them.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

import numpy as np
from pydantic import SecretStr

from calls.metadata import clean_value
from calls.roles import Role
from wsaudio.errors import CLOSE_INVALID, CLOSE_UNSUPPORTED, PeerError

Dialect = Literal["wenet", "hotline", "audio_fork"]
Mix = Literal["mono", "mixed", "stereo"]
HOTLINE_SUBPROTOCOL = "hotline-asr.v1"
HOTLINE_PATH = "/v1/stream"
AUDIO_FORK_SUBPROTOCOL = "audio.drachtio.org"
AUDIO_FORK_PATH = "/audio_fork"
RATES = (8000, 16000)
MAX_ATTRIBUTES = 32
"""Most attributes (query parameters plus metadata values) a stream keeps."""
_MIXES: dict[str, Mix] = {"mono": "mono", "mixed": "mixed", "stereo": "stereo"}


@dataclass(frozen=True)
class Handshake:
    dialect: Dialect
    subprotocol: str | None
    """The subprotocol we accept (the one the client offered and we speak), or None."""
    attributes: dict[str, str]
    token: str | None
    """The bearer token offered (``Authorization: Bearer``, else ``?token=`` for browsers)."""


@dataclass(frozen=True)
class StreamStart:
    """What a stream's first text message (with its handshake) says."""

    sample_rate: int
    mix: Mix
    """``mono``/``mixed``: one leg; ``stereo``: two interleaved channels, two legs."""
    attributes: dict[str, str]
    nbest: int = 1
    chunk_ms: int | None = None
    left_chunks: int | None = None

    @property
    def channels(self) -> int:
        return 2 if self.mix == "stereo" else 1


def read_handshake(target: str, subprotocols: list[str], headers: list[tuple[bytes, bytes]]) -> Handshake:
    """The dialect, subprotocol, attributes and token of an upgrade request for ``target``."""
    parts = urlsplit(target)
    query = {clean_value(k): clean_value(v) for k, v in parse_qsl(parts.query)[:MAX_ATTRIBUTES]}
    token = query.pop("token", None)
    for name, value in headers:
        if name.lower() == b"authorization" and value[:7].lower() == b"bearer ":
            token = value[7:].decode("latin-1").strip()
    if AUDIO_FORK_SUBPROTOCOL in subprotocols or parts.path == AUDIO_FORK_PATH:
        chosen = AUDIO_FORK_SUBPROTOCOL if AUDIO_FORK_SUBPROTOCOL in subprotocols else None
        return Handshake("audio_fork", chosen, query, token)
    if HOTLINE_SUBPROTOCOL in subprotocols or parts.path == HOTLINE_PATH:
        chosen = HOTLINE_SUBPROTOCOL if HOTLINE_SUBPROTOCOL in subprotocols else None
        return Handshake("hotline", chosen, query, token)
    return Handshake("wenet", None, query, token)


def token_matches(offered: str | None, tokens: Sequence[SecretStr]) -> bool:
    """Whether the token ``offered`` is one of ``tokens``; every one is compared, each in
    constant time, so the answer's timing says nothing of which came close."""
    given = (offered or "").encode()
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(given, token.get_secret_value().encode())
    return matched


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise PeerError("bad_json", f"text message is not JSON: {exc}", CLOSE_INVALID) from None
    if not isinstance(value, dict):
        raise PeerError("bad_json", "text message is not a JSON object", CLOSE_INVALID)
    return value


def _int(message: dict[str, Any], key: str, default: int) -> int:
    value = message.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise PeerError("bad_start", f"{key} must be an integer, got {value!r}", CLOSE_INVALID)
    return value


def _rate(value: int | str) -> int:
    rate = {"8k": 8000, "16k": 16000}.get(str(value).lower())
    if rate is None:
        try:
            rate = int(value)
        except ValueError:
            rate = 0
    if rate not in RATES:
        raise PeerError("unsupported_rate", f"sample rate {value} is not one of 8000, 16000", CLOSE_UNSUPPORTED)
    return rate


def read_start(handshake: Handshake, text: str) -> StreamStart:
    """The stream's first text message: a start signal (``wenet``, ``hotline``) or the metadata
    (``audio_fork``); PeerError when it is neither."""
    message = _json_object(text)
    if handshake.dialect == "audio_fork":
        attributes = dict(handshake.attributes)
        for key, value in message.items():
            if (
                isinstance(value, str | int | float)
                and not isinstance(value, bool)
                and len(attributes) < MAX_ATTRIBUTES
            ):
                attributes.setdefault(clean_value(str(key)), clean_value(str(value)))
        name = attributes.get("mix", "mono")  # the query's, else the metadata's
        mix = _MIXES.get(name)
        if mix is None:
            raise PeerError("bad_start", f"mix {name!r} is not one of mono, mixed, stereo", CLOSE_UNSUPPORTED)
        return StreamStart(_rate(attributes.get("rate", 8000)), mix, attributes)
    if message.get("signal") != "start":
        raise PeerError("no_start", f"the first text message must be the start signal, got {text[:80]!r}")
    nbest = _int(message, "nbest", 1)
    if handshake.dialect == "wenet":
        return StreamStart(16000, "mono", dict(handshake.attributes), nbest=max(1, nbest))
    left = message.get("left_chunks")
    chunk = message.get("chunk_ms")
    return StreamStart(
        _rate(_int(message, "sample_rate", 16000)),
        "mono",
        dict(handshake.attributes),
        nbest=max(1, nbest),
        chunk_ms=None if chunk is None else _int(message, "chunk_ms", 0),
        left_chunks=None if left is None else _int(message, "left_chunks", 0),
    )


def is_end(text: str) -> bool:
    """Whether a later text message is the end signal; PeerError for anything else."""
    if _json_object(text).get("signal") == "end":
        return True
    raise PeerError("unexpected_text", f"only the end signal may follow the start, got {text[:80]!r}")


def roles_of(mix: Mix, stereo_order: tuple[Role, ...]) -> tuple[Role, ...]:
    """The roles of a stream's legs: ``mono`` the caller, ``mixed`` both parties, ``stereo`` the
    channels in ``stereo_order`` (a route's ``roles.label_order``)."""
    if mix == "stereo":
        return (stereo_order + ("caller", "agent"))[:2]
    return ("caller",) if mix == "mono" else ("mixed",)


def split_channels(payload: bytes, channels: int) -> list[np.ndarray]:
    """Little-endian 16-bit PCM, ``channels`` interleaved, as one int16 array (N,) per channel."""
    if len(payload) % (2 * channels):
        raise PeerError(
            "odd_length", f"binary message of {len(payload)} bytes is not whole {channels}-channel 16-bit frames",
            CLOSE_UNSUPPORTED,
        )  # fmt: skip
    samples = np.frombuffer(payload, dtype="<i2").astype(np.int16)
    if channels == 1:
        return [samples]
    frames = samples.reshape(-1, channels)  # (N, channels)
    return [np.ascontiguousarray(frames[:, c]) for c in range(channels)]


def server_ready(dialect: Dialect, call_id: str, start: StreamStart, chunk_ms: int, left_chunks: int) -> str | None:
    """The reply to a start signal (none to ``audio_fork`` metadata)."""
    if dialect == "audio_fork":
        return None
    reply: dict[str, Any] = {"status": "ok", "type": "server_ready"}
    if dialect == "hotline":
        reply.update(call_id=call_id, sample_rate=start.sample_rate, chunk_ms=chunk_ms, left_chunks=left_chunks)
    return json.dumps(reply)


def wenet_reply(event: dict[str, Any], nbest: int) -> str | None:
    """WeNet's reply to one of our events: partials and finals, None for the others."""
    kind = event.get("event_type")
    if kind not in ("transcript.partial", "transcript.final"):
        return None
    sentences = [{"sentence": event.get("text", "")}]
    if kind == "transcript.final":
        others = [alt.get("text", "") for alt in event.get("nbest") or [] if isinstance(alt, dict)]
        sentences += [{"sentence": text} for text in others if text != sentences[0]["sentence"]]
    result = "partial_result" if kind == "transcript.partial" else "final_result"
    return json.dumps({"status": "ok", "type": result, "nbest": json.dumps(sentences[:nbest], ensure_ascii=False)})


SPEECH_END = json.dumps({"status": "ok", "type": "speech_end"})
"""WeNet's last reply: every final of the stream was sent."""
