"""SIPREC (RFC 7865 metadata, RFC 7866 protocol): recognise recording sessions and read their metadata.

A Session Recording Client (an SBC or PBX) sends an INVITE with ``Require: siprec``, a
Contact with ``+sip.src`` (AudioCodes: ``;src``) and a multipart body holding the SDP and
``application/rs-metadata+xml``. Each SDP m-line carries ``a=label``; the metadata maps labels
to streams and streams to participants (``participantstreamassoc``/``send``). We accept the
RFC form, the older draft form used by Oracle/Acme SBCs (``<participant id=...><send>``) and
any namespace prefix. The streams' roles are the call model's rule (``calls.roles``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from sip.errors import SipParseError
from sip.header_values import NameAddr
from sip.message import Request
from sip.multipart import media_type, parse_multipart

METADATA_TYPES = ("application/rs-metadata+xml", "application/rs-metadata")
MAX_METADATA_BYTES = 65536


def is_siprec(request: Request) -> bool:
    """True when the INVITE asks to be recorded per RFC 7866 (or AudioCodes' variant)."""
    if any(option.lower() == "siprec" for option in request.headers.get_all("Require")):
        return True
    for contact in request.headers.get_all("Contact"):
        try:
            params = NameAddr.parse(contact).params
        except SipParseError:
            continue
        if "+sip.src" in params or "src" in params:
            return True
    return False


def split_body(content_type: str | None, body: bytes) -> tuple[bytes | None, bytes | None]:
    """(SDP, metadata) from a plain ``application/sdp`` or a ``multipart/mixed`` body."""
    kind, _ = media_type(content_type)
    if not body:
        return None, None
    if kind == "application/sdp":
        return body, None
    if kind.startswith("multipart/"):
        sdp: bytes | None = None
        metadata: bytes | None = None
        for part in parse_multipart(content_type or "", body):
            part_kind, _ = media_type(part.content_type)
            if part_kind == "application/sdp" and sdp is None:
                sdp = part.body
            elif part_kind in METADATA_TYPES and metadata is None:
                metadata = part.body
        return sdp, metadata
    if kind in METADATA_TYPES:
        return None, body
    raise SipParseError(f"unsupported body type {kind!r}; send application/sdp or multipart/mixed", 415)


@dataclass
class Participant:
    participant_id: str
    aor: str | None
    name: str | None
    sends: list[str] = field(default_factory=list)


@dataclass
class RecordingMetadata:
    """What we use from the metadata: participants with the stream ids they send, labels, and
    the recording session's id (``<session session_id=...>``; the draft form's ``id``)."""

    participants: list[Participant]
    stream_labels: dict[str, str]
    session_id: str | None = None

    def participant_for_label(self, label: str) -> Participant | None:
        for participant in self.participants:
            for stream_id in participant.sends:
                if self.stream_labels.get(stream_id) == label:
                    return participant
        return None

    @classmethod
    def parse(cls, data: bytes) -> RecordingMetadata:
        if len(data) > MAX_METADATA_BYTES:
            raise SipParseError(f"recording metadata larger than {MAX_METADATA_BYTES} bytes", 413)
        if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
            raise SipParseError("recording metadata must not contain a DOCTYPE or entities", 400)
        try:
            root = ET.fromstring(data)
        except ET.ParseError as exc:
            raise SipParseError(f"recording metadata is not well-formed XML: {exc}", 400) from None
        except (LookupError, ValueError) as exc:  # an encoding the XML declares but Python lacks
            raise SipParseError(f"recording metadata cannot be decoded: {exc}", 400) from None
        if _local(root.tag) != "recording":
            raise SipParseError(f"recording metadata root is <{_local(root.tag)}>, expected <recording>", 400)
        participants: dict[str, Participant] = {}
        labels: dict[str, str] = {}
        session_id: str | None = None
        for element in root:
            tag = _local(element.tag)
            if tag == "participant":
                pid = _attr(element, "participant_id", "id")
                if pid is None:
                    continue
                participant = participants.setdefault(pid, Participant(pid, None, None))
                _read_name(element, participant)
                participant.sends.extend(_texts(element, "send"))
            elif tag == "stream":
                sid = _attr(element, "stream_id", "id")
                label = next(iter(_texts(element, "label")), None)
                if sid is not None and label is not None:
                    labels[sid] = label
            elif tag == "session" and session_id is None:
                session_id = _attr(element, "session_id", "id") or None
            elif tag == "participantstreamassoc":
                pid = _attr(element, "participant_id", "id")
                if pid is not None:
                    participant = participants.setdefault(pid, Participant(pid, None, None))
                    participant.sends.extend(_texts(element, "send"))
        return cls(list(participants.values()), labels, session_id)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1].rsplit(":", 1)[-1]


def _attr(element: ET.Element, *names: str) -> str | None:
    for key, value in element.attrib.items():
        if _local(key) in names:
            return value.strip()
    return None


def _texts(element: ET.Element, tag: str) -> list[str]:
    return [(child.text or "").strip() for child in element if _local(child.tag) == tag and (child.text or "").strip()]


def _read_name(element: ET.Element, participant: Participant) -> None:
    for child in element:
        tag = _local(child.tag)
        if tag == "nameID":
            participant.aor = _attr(child, "aor") or participant.aor
            for sub in child:
                if _local(sub.tag) == "name" and (sub.text or "").strip():
                    participant.name = (sub.text or "").strip()
        elif tag == "aor" and (child.text or "").strip():
            participant.aor = (child.text or "").strip()
        elif tag == "name" and (child.text or "").strip():
            participant.name = (child.text or "").strip()
