"""SIP messages as values: parse bytes into a ``Request``/``Response`` and serialize them back.

Sans-IO: nothing here touches sockets. Header names are stored in their canonical long form
(compact ``i``, ``f``, ``v`` ... are expanded on parse), so ``parse(bytes(msg)) == msg``.
Over UDP one datagram is one message (``parse``); over TCP/TLS ``sip.framing.StreamFramer``
cuts the byte stream into messages first. Header values (name-addr, URIs, Via, params) are
parsed by ``sip.header_values``. Every parse failure raises ``SipParseError``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from sip.errors import SipParseError
from sip.header_values import DIGITS, TOKEN, split_list

SIP_VERSION = "SIP/2.0"
BRANCH_MAGIC = "z9hG4bK"

COMPACT_NAMES = {
    "a": "Accept-Contact",
    "b": "Referred-By",
    "c": "Content-Type",
    "d": "Request-Disposition",
    "e": "Content-Encoding",
    "f": "From",
    "i": "Call-ID",
    "j": "Reject-Contact",
    "k": "Supported",
    "l": "Content-Length",
    "m": "Contact",
    "o": "Event",
    "r": "Refer-To",
    "s": "Subject",
    "t": "To",
    "u": "Allow-Events",
    "v": "Via",
    "x": "Session-Expires",
    "y": "Identity",
}
_CANONICAL = {
    name.lower(): name
    for name in (
        "Accept",
        "Accept-Encoding",
        "Accept-Language",
        "Alert-Info",
        "Allow",
        "Authorization",
        "Call-ID",
        "Call-Info",
        "Contact",
        "Content-Disposition",
        "Content-Encoding",
        "Content-Length",
        "Content-Type",
        "CSeq",
        "Date",
        "Expires",
        "From",
        "Max-Forwards",
        "Min-SE",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Record-Route",
        "Require",
        "Retry-After",
        "Route",
        "Server",
        "Session-Expires",
        "Supported",
        "To",
        "Unsupported",
        "User-Agent",
        "Via",
        "Warning",
        "WWW-Authenticate",
        *COMPACT_NAMES.values(),
    )
}
# Headers whose values contain commas that do not separate list elements (RFC 3261 7.3.1).
_NOT_LISTS = frozenset(
    {"authorization", "proxy-authorization", "www-authenticate", "proxy-authenticate", "date", "subject", "call-id"}
)
_STATUS_LINE = re.compile(r"^SIP/2\.0 ([1-6][0-9][0-9]) ?(.*)$")
_REQUEST_LINE = re.compile(r"^([A-Za-z0-9.!%*_+`'~-]+) (\S+) SIP/2\.0$")


@functools.lru_cache(maxsize=1024)
def canonical_name(name: str) -> str:
    """``"i"`` -> ``"Call-ID"``, ``"cseq"`` -> ``"CSeq"``; unknown names keep their spelling."""
    lower = name.lower()
    if len(lower) == 1 and lower in COMPACT_NAMES:
        return COMPACT_NAMES[lower]
    return _CANONICAL.get(lower, name)


@dataclass
class Headers:
    """Ordered (name, value) pairs; lookups are case-insensitive and know the compact forms."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str, default: str | None = None) -> str | None:
        wanted = canonical_name(name).lower()
        for key, value in self.items:
            if key.lower() == wanted:
                return value
        return default

    def get_all(self, name: str) -> list[str]:
        """Every element of a list-valued header, over all its lines, split at top-level commas."""
        wanted = canonical_name(name).lower()
        values: list[str] = []
        for key, value in self.items:
            if key.lower() == wanted:
                values.extend([value] if wanted in _NOT_LISTS else split_list(value))
        return values

    def add(self, name: str, value: str) -> None:
        self.items.append((canonical_name(name), value))

    def set(self, name: str, value: str) -> None:
        """Replace every line of ``name`` by one line (kept at the first one's position)."""
        wanted = canonical_name(name)
        out: list[tuple[str, str]] = []
        placed = False
        for key, old in self.items:
            if key.lower() == wanted.lower():
                if not placed:
                    out.append((wanted, value))
                    placed = True
            else:
                out.append((key, old))
        if not placed:
            out.append((wanted, value))
        self.items = out

    def remove(self, name: str) -> None:
        wanted = canonical_name(name).lower()
        self.items = [(k, v) for k, v in self.items if k.lower() != wanted]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.items)


@dataclass
class Request:
    method: str
    uri: str
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""

    def start_line(self) -> str:
        return f"{self.method} {self.uri} {SIP_VERSION}"

    def __bytes__(self) -> bytes:
        return _serialize(self.start_line(), self.headers, self.body)


@dataclass
class Response:
    status: int
    reason: str
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""

    def start_line(self) -> str:
        return f"{SIP_VERSION} {self.status} {self.reason}"

    def __bytes__(self) -> bytes:
        return _serialize(self.start_line(), self.headers, self.body)


Message = Request | Response


def _serialize(start: str, headers: Headers, body: bytes) -> bytes:
    lines = [start]
    lines.extend(f"{name}: {value}" for name, value in headers.items if name.lower() != "content-length")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


def _split_head(data: bytes) -> tuple[bytes, bytes]:
    end = data.find(b"\r\n\r\n")
    if end < 0:
        raise SipParseError("truncated message: no blank line (CRLF CRLF) after the headers")
    return data[:end], data[end + 4 :]


def _header_lines(head: str) -> list[str]:
    """Split the header block into logical lines, unfolding continuation lines (RFC 3261 7.3.1)."""
    lines: list[str] = []
    for raw in head.split("\r\n"):
        if raw[:1] in (" ", "\t"):
            if not lines:
                raise SipParseError("continuation line before the first header")
            lines[-1] = lines[-1] + " " + raw.strip()
        else:
            lines.append(raw)
    return lines


def parse(data: bytes) -> Message:
    """Parse one complete SIP message (one UDP datagram, or one frame of a stream)."""
    head_bytes, rest = _split_head(data)
    try:
        head = head_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SipParseError(f"header block is not UTF-8 (byte {exc.start})") from None
    lines = _header_lines(head)
    start = lines[0]
    headers = Headers()
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        name = name.strip()
        if not sep or not TOKEN.match(name):
            raise SipParseError(f"malformed header line {line[:60]!r}")
        headers.add(name, value.strip())
    length_text = headers.get("Content-Length")
    if length_text is None:
        body = rest
    else:
        if not DIGITS.match(length_text):
            raise SipParseError(f"Content-Length {length_text[:20]!r} is not a number")
        length = int(length_text)
        if length > len(rest):
            raise SipParseError(f"truncated body: Content-Length {length} but {len(rest)} bytes follow")
        body = rest[:length]
    headers.remove("Content-Length")
    status = _STATUS_LINE.match(start)
    if status:
        return Response(int(status.group(1)), status.group(2), headers, body)
    request = _REQUEST_LINE.match(start)
    if request:
        return Request(request.group(1), request.group(2), headers, body)
    raise SipParseError(f"malformed start line {start[:60]!r}")


@dataclass(frozen=True)
class Address:
    """Where a message came from or goes: transport (``udp``/``tcp``/``tls``), host, port."""

    transport: str
    host: str
    port: int
