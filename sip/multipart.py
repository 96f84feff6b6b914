"""Multipart message bodies (RFC 2046), as SIPREC sends them: the SDP offer beside the
recording metadata. Sans-IO; a malformed body raises ``SipParseError`` (415 without a
boundary, 400 when no part is delimited)."""

from __future__ import annotations

from dataclasses import dataclass

from sip.errors import SipParseError
from sip.header_values import parse_params
from sip.message import canonical_name


@dataclass(frozen=True)
class BodyPart:
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def media_type(content_type: str | None) -> tuple[str, dict[str, str | None]]:
    """``'multipart/mixed;boundary="x"'`` -> ``("multipart/mixed", {"boundary": "x"})``."""
    kind, _, params = (content_type or "").partition(";")
    return kind.strip().lower(), parse_params(params)


def parse_multipart(content_type: str, body: bytes) -> list[BodyPart]:
    """Split a multipart body (RFC 2046) into its parts."""
    _, params = media_type(content_type)
    boundary = params.get("boundary")
    if not boundary:
        raise SipParseError("multipart body without a boundary parameter", 415)
    delimiter = b"--" + boundary.encode("utf-8")
    chunks = body.split(delimiter)
    if len(chunks) < 3:
        raise SipParseError(f"multipart body has no part delimited by {boundary!r}", 400)
    parts: list[BodyPart] = []
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            break
        chunk = chunk.removeprefix(b"\r\n").removeprefix(b"\n")
        head, sep, content = chunk.partition(b"\r\n\r\n")
        if not sep:
            head, sep, content = chunk.partition(b"\n\n")
        if not sep:
            head, content = b"", chunk
        content = content[:-2] if content.endswith(b"\r\n") else content.removesuffix(b"\n")
        headers: list[tuple[str, str]] = []
        for line in head.decode("utf-8", "replace").splitlines():
            name, colon, value = line.partition(":")
            if colon:
                headers.append((canonical_name(name.strip()), value.strip()))
        part_type = next((v for k, v in headers if k.lower() == "content-type"), "text/plain")
        parts.append(BodyPart(part_type, content, tuple(headers)))
    return parts


def build_multipart(parts: list[BodyPart], boundary: str) -> bytes:
    """The multipart body (RFC 2046) of ``parts`` delimited by ``boundary`` (tests, peers)."""
    out = bytearray()
    for part in parts:
        out += f"--{boundary}\r\n".encode()
        headers = part.headers or (("Content-Type", part.content_type),)
        for name, value in headers:
            out += f"{name}: {value}\r\n".encode()
        out += b"\r\n" + part.body + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out)
