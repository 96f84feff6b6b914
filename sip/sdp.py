"""SDP offer/answer (RFC 3264/4566) for a receive-only recorder.

We read offers with a small parser of our own because we need ``a=label`` (RFC 4574), which
SIPREC uses to tie streams to participants. The codecs we take are the table of
``rtp.codecs``: each audio m-line is answered ``recvonly`` with the offered audio codec of the
highest sample rate (G.722 before G.711), among those the offerer's first, plus
``telephone-event`` (RFC 4733) at 8 or 16 kHz when offered. A stream offered with port 0, or without a codec
we take, is answered with port 0; when no stream is left the offer is refused with 488.

When the peer sends no offer (a delayed-offer INVITE or re-INVITE, RFC 3261 13.2.1) we make
one: ``build_offer`` lists the codecs we take (``OUR_PAYLOAD_TYPES``), ``recvonly``, and the
answer in the ACK is read with ``plan_answer``.

Which m-line protocols are taken is the route's SRTP policy (``SrtpPolicy``): ``off`` takes
plain RTP/AVP(F) only (``PLAIN_RTP``), ``required`` SDES-keyed RTP/SAVP(F) only
(``SDES_SRTP``), ``optional`` either. An SRTP stream is answered with our own ``a=crypto``
line (``sip.sdes``) and its plan carries the offerer's key for the leg; an SRTP m-line
without a usable crypto line makes the offer a 488 (``sip.sdes.SdesError``).
``offers_srtp`` tells a refusal for the policy apart from one for codecs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rtp.codecs import CODECS, Codec, CodecKind, codec_named, find_codec, static_codec
from rtp.srtp import AWAITING_KEYS
from sip.errors import SipParseError
from sip.sdes import SUITES, SdesKey, answer_line, crypto_line, select_key

DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
PLAIN_RTP = frozenset({"RTP/AVP", "RTP/AVPF"})
"""Unencrypted RTP m-line protocols."""
SDES_SRTP = frozenset({"RTP/SAVP", "RTP/SAVPF"})
"""SRTP m-line protocols keyed by SDES ``a=crypto`` lines. DTLS-SRTP (``UDP/TLS/RTP/SAVP``) is
never taken: answering it without its handshake would leave us decoding ciphertext."""
SrtpPolicy = Literal["off", "optional", "required"]
_TAKEN: dict[str, frozenset[str]] = {"off": PLAIN_RTP, "optional": PLAIN_RTP | SDES_SRTP, "required": SDES_SRTP}
OUR_PAYLOAD_TYPES: dict[int, str] = {
    codec.payload_type: codec.name for codec in CODECS if codec.kind is not CodecKind.COMFORT_NOISE
}
"""What our own offers list: the audio codecs of ``rtp.codecs.CODECS`` in its order (static
payload types, or the numbers it gives dynamic ones), then RFC 4733 events on the customary 101."""


def _taken_codecs() -> str:
    names = [codec.name for codec in CODECS if codec.kind is CodecKind.AUDIO]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


TAKEN_CODECS = _taken_codecs()
"""The audio codecs we take, for messages: ``"G722, PCMU or PCMA"``."""


@dataclass
class MediaDescription:
    media: str
    port: int
    proto: str
    formats: list[str]
    rtpmap: dict[int, str] = field(default_factory=dict)
    direction: str | None = None
    label: str | None = None
    connection: str | None = None
    crypto: list[str] = field(default_factory=list, repr=False)
    """``a=crypto`` values (RFC 4568), kept out of ``repr``: they hold the peer's keys."""

    def encoding(self, payload_type: int) -> str | None:
        """The upper-cased encoding name of ``payload_type`` (``"PCMU"``), from rtpmap or the static table."""
        mapped = self.rtpmap.get(payload_type)
        if mapped is not None:
            return mapped.split("/", 1)[0].upper()
        codec = static_codec(payload_type)
        return codec.encoding.upper() if codec is not None else None

    def codec(self, payload_type: int) -> Codec | None:
        """The codec of ``payload_type`` we take (``rtp.codecs``), from its rtpmap
        (``L16/16000``, mono only) or, without one, the static table; None otherwise."""
        mapped = self.rtpmap.get(payload_type)
        if mapped is None:
            return static_codec(payload_type)
        encoding, _, rest = mapped.partition("/")
        rate, _, channels = rest.partition("/")
        if not rate.isascii() or not rate.isdigit() or not (channels == "" or channels.isdigit()):
            return None
        return find_codec(encoding, int(rate), int(channels or 1))


@dataclass
class SessionDescription:
    connection: str | None
    direction: str | None
    media: list[MediaDescription]

    @classmethod
    def parse(cls, data: bytes | str) -> SessionDescription:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        connection: str | None = None
        direction: str | None = None
        media: list[MediaDescription] = []
        saw_version = False
        for raw in text.splitlines():
            line = raw.strip()
            if not line:
                continue
            if len(line) < 2 or line[1] != "=":
                raise SipParseError(f"SDP line {line[:40]!r} is not <type>=<value>", 400)
            kind, value = line[0], line[2:]
            if kind == "v":
                saw_version = True
            elif kind == "m":
                media.append(_parse_m_line(value))
            elif kind == "c":
                address = _parse_c_line(value)
                if media:
                    media[-1].connection = address
                else:
                    connection = address
            elif kind == "a":
                name, _, attr = value.partition(":")
                target = media[-1] if media else None
                if name in DIRECTIONS:
                    if target is None:
                        direction = name
                    else:
                        target.direction = name
                elif target is not None and name == "crypto":
                    target.crypto.append(attr.strip())
                elif target is not None and name == "label":
                    target.label = attr.strip()
                elif target is not None and name == "rtpmap":
                    pt, _, encoding = attr.strip().partition(" ")
                    if pt.isdigit() and encoding:
                        target.rtpmap[int(pt)] = encoding.strip()
        if not saw_version:
            raise SipParseError("SDP has no v= line", 400)
        return cls(connection, direction, media)


def _parse_m_line(value: str) -> MediaDescription:
    fields = value.split()
    if len(fields) < 4:
        raise SipParseError(f"SDP m= line {value[:60]!r} needs media, port, proto and formats", 400)
    port_text = fields[1].split("/", 1)[0]
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise SipParseError(f"SDP m= line has a bad port {fields[1][:10]!r}", 400)
    return MediaDescription(fields[0], int(port_text), fields[2], fields[3:])


def _parse_c_line(value: str) -> str:
    fields = value.split()
    if len(fields) != 3 or fields[0] != "IN" or fields[1] not in ("IP4", "IP6"):
        raise SipParseError(f"SDP c= line {value[:60]!r} is not 'IN IP4|IP6 <address>'", 400)
    return fields[2].split("/", 1)[0]


@dataclass(frozen=True)
class StreamPlan:
    """What we accepted for one offered m-line (``index`` counts m-lines from 0); ``srtp`` is
    the offerer's SDES key for an SRTP stream."""

    index: int
    label: str | None
    codec: str
    payload_types: dict[int, str]
    direction: str
    on_hold: bool
    remote: tuple[str, int] | None
    srtp: SdesKey | None = None


def plan_streams(
    offer: SessionDescription, sendonly_is_hold: bool = True, srtp: SrtpPolicy = "off"
) -> list[StreamPlan]:
    """The audio streams we will receive; empty when nothing acceptable was offered.

    Our direction is ``recvonly``, or ``inactive`` when the peer will not send. A stream is on
    hold (the RTP inactivity timer pauses) when the peer sends nothing, or, for a plain call
    (``sendonly_is_hold``), when it offers ``sendonly``; a SIPREC client always offers sendonly.
    ``srtp`` is the route's policy; ``SdesError`` (488) for a taken SRTP line without a usable key.
    """
    plans: list[StreamPlan] = []
    taken = _TAKEN[srtp]
    for index, media in enumerate(offer.media):
        proto = media.proto.upper()
        if media.media != "audio" or media.port == 0 or proto not in taken:
            continue
        picked = _pick_codec(media)
        if picked is None:
            continue
        codec_pt, codec = picked
        payload_types = {codec_pt: codec.name}
        for pt in _payload_numbers(media):
            offered = media.codec(pt)
            if offered is not None and offered.kind is CodecKind.EVENTS:
                payload_types[pt] = offered.name
        direction = media.direction or offer.direction or "sendrecv"
        address = media.connection or offer.connection
        remote = (address, media.port) if address else None
        silent = direction in ("inactive", "recvonly")
        on_hold = silent or (sendonly_is_hold and direction == "sendonly")
        answer = "inactive" if silent else "recvonly"
        key = select_key(media.crypto) if proto in SDES_SRTP else None
        plans.append(StreamPlan(index, media.label, codec.name, payload_types, answer, on_hold, remote, key))
    return plans


def offers_plain(offer: SessionDescription) -> bool:
    """True when the offer has an audio m-line of plain RTP/AVP(F)."""
    return any(m.media == "audio" and m.port != 0 and m.proto.upper() in PLAIN_RTP for m in offer.media)


def _payload_numbers(media: MediaDescription) -> list[int]:
    return [int(fmt) for fmt in media.formats if fmt.isascii() and fmt.isdigit()]


def _pick_codec(media: MediaDescription) -> tuple[int, Codec] | None:
    """The (payload type, codec) we receive on ``media``: of the audio codecs offered that we
    take, the one of the highest sample rate, among those the first offered; None when none."""
    best: tuple[int, Codec] | None = None
    for pt in _payload_numbers(media):
        codec = media.codec(pt)
        if codec is None or codec.kind is not CodecKind.AUDIO:
            continue
        if best is None or codec.sample_rate > best[1].sample_rate:
            best = pt, codec
    return best


def offers_srtp(offer: SessionDescription) -> bool:
    """True when the offer has an audio m-line with an SRTP profile (``RTP/SAVP``, ``RTP/SAVPF``,
    ``UDP/TLS/RTP/SAVP``...), the kind ``plan_streams`` never takes."""
    return any(m.media == "audio" and m.port != 0 and "SAVP" in m.proto.upper() for m in offer.media)


def build_answer(
    offer: SessionDescription,
    plans: list[StreamPlan],
    ports: dict[int, int],
    host: str,
    session_id: int,
    version: int,
) -> bytes:
    """Our answer: one m-line per offered m-line, ``recvonly`` (``inactive`` on hold) or port 0."""
    family = "IP6" if ":" in host else "IP4"
    lines = _session_lines(host, family, session_id, version)
    by_index = {plan.index: plan for plan in plans}
    for index, media in enumerate(offer.media):
        plan = by_index.get(index)
        if plan is None or index not in ports:
            lines.append(f"m={media.media} 0 {media.proto} {' '.join(media.formats)}")
            continue
        crypto = [answer_line(plan.srtp)] if plan.srtp is not None else []
        lines += _audio_lines(ports[index], media.proto, plan.payload_types, plan.label, plan.direction, crypto)
    return ("\r\n".join(lines) + "\r\n").encode("utf-8")


def offered_plan(index: int, label: str | None, srtp: SrtpPolicy = "off") -> StreamPlan:
    """The stream we offer on m-line ``index`` before the answer says anything: every codec we
    take, and on hold (no RTP inactivity timeout) until the answer says the peer will send.
    An SRTP offer (``srtp: required``) drops packets until the answer brings the peer's key."""
    awaiting = SdesKey(0, AWAITING_KEYS) if srtp == "required" else None
    return StreamPlan(index, label, "PCMU", dict(OUR_PAYLOAD_TYPES), "recvonly", True, None, awaiting)


def plan_answer(answer: SessionDescription, srtp: SrtpPolicy = "off") -> list[StreamPlan]:
    """The streams an answer to our ``recvonly`` offer gives us. ``sendonly`` (or ``sendrecv``)
    means the peer will send; ``inactive`` or ``recvonly`` that it will not (on hold). An SRTP
    answer's ``a=crypto`` line holds the key the peer sends with."""
    return plan_streams(answer, sendonly_is_hold=False, srtp=srtp)


def build_offer(
    layout: list[MediaDescription],
    plans: list[StreamPlan],
    ports: dict[int, int],
    host: str,
    session_id: int,
    version: int,
    srtp: SrtpPolicy = "off",
) -> bytes:
    """Our offer: one m-line per entry of ``layout`` (the session's m-lines so far; RFC 3264 8
    forbids dropping any). A line with a planned stream and a port offers ``OUR_PAYLOAD_TYPES``
    ``recvonly``; any other keeps its media and protocol with port 0. With ``srtp: required``
    the offer is RTP/SAVP with a crypto line per suite (``optional`` offers plain RTP/AVP:
    SDP cannot offer both on one m-line without capability negotiation)."""
    family = "IP6" if ":" in host else "IP4"
    lines = _session_lines(host, family, session_id, version)
    by_index = {plan.index: plan for plan in plans}
    for index, media in enumerate(layout):
        plan = by_index.get(index)
        if plan is None or index not in ports:
            lines.append(f"m={media.media} 0 {media.proto} {' '.join(media.formats)}")
            continue
        if srtp == "required":
            crypto = [crypto_line(tag, suite) for tag, suite in enumerate(SUITES, start=1)]
            lines += _audio_lines(ports[index], "RTP/SAVP", OUR_PAYLOAD_TYPES, plan.label, "recvonly", crypto)
        else:
            lines += _audio_lines(ports[index], "RTP/AVP", OUR_PAYLOAD_TYPES, plan.label, "recvonly")
    return ("\r\n".join(lines) + "\r\n").encode("utf-8")


def _session_lines(host: str, family: str, session_id: int, version: int) -> list[str]:
    return [
        "v=0",
        f"o=hotline-asr {session_id} {version} IN {family} {host}",
        "s=hotline-asr",
        f"c=IN {family} {host}",
        "t=0 0",
    ]


def _audio_lines(
    port: int,
    proto: str,
    payload_types: dict[int, str],
    label: str | None,
    direction: str,
    crypto: list[str] | None = None,
) -> list[str]:
    lines = [f"m=audio {port} {proto} {' '.join(str(pt) for pt in payload_types)}"]
    lines += crypto or []
    for pt, name in payload_types.items():
        codec = codec_named(name)
        lines.append(f"a=rtpmap:{pt} {codec.rtpmap if codec is not None else name + '/8000'}")
        if codec is not None and codec.kind is CodecKind.EVENTS:
            lines.append(f"a=fmtp:{pt} 0-15")
    if label is not None:
        lines.append(f"a=label:{label}")
    lines.append(f"a={direction}")
    lines.append(f"a=rtcp:{port + 1}")
    return lines
