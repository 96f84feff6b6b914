"""SIP messages as values: parse bytes into a ``Request``/``Response`` and serialize them back.

Sans-IO: nothing here touches sockets. Header names are stored in their canonical long form
(compact ``i``, ``f``, ``v`` ... are expanded on parse), so ``parse(bytes(msg)) == msg``.
Over UDP one datagram is one message (``parse``); over TCP/TLS a ``StreamFramer`` cuts the byte
stream into messages using Content-Length. Every parse failure raises ``SipParseError``.
Kept whole (just over 500 lines): parsing and serializing are the two halves of one round
trip and are tested as such.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from sip.errors import SipParseError

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
_TOKEN = re.compile(r"^[A-Za-z0-9.!%*_+`'~-]+$")
_DIGITS = re.compile(r"^[0-9]{1,9}$")
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
        if not sep or not _TOKEN.match(name):
            raise SipParseError(f"malformed header line {line[:60]!r}")
        headers.add(name, value.strip())
    length_text = headers.get("Content-Length")
    if length_text is None:
        body = rest
    else:
        if not _DIGITS.match(length_text):
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


class StreamFramer:
    """Cut a TCP/TLS byte stream into SIP messages (RFC 3261 18.3).

    Feed it any chunks with ``feed``; ``next_message`` returns the bytes of one complete
    message or ``None`` (need more data). CRLF keep-alives between messages are skipped and
    counted in ``keepalives`` so the transport can answer a double-CRLF ping with a CRLF pong.
    """

    def __init__(self, max_message_bytes: int = 65536, max_header_bytes: int | None = None) -> None:
        self._buffer = bytearray()
        self._max = max_message_bytes
        self._max_header = min(max_message_bytes, max_header_bytes or max_message_bytes)
        self.keepalives = 0

    @property
    def pending(self) -> bool:
        """Whether part of a message (not just keep-alive CRLFs) is waiting for the rest."""
        return bool(self._buffer.strip(b"\r\n"))

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_message(self) -> bytes | None:
        while self._buffer[:2] == b"\r\n":
            if self._buffer[:4] == b"\r\n\r\n":
                self.keepalives += 1
                del self._buffer[:4]
            else:
                del self._buffer[:2]
        if self._buffer[:1] == b"\r" and len(self._buffer) == 1:
            return None
        end = self._buffer.find(b"\r\n\r\n")
        if end > self._max_header or (end < 0 and len(self._buffer) > self._max_header):
            raise SipParseError(f"header block longer than {self._max_header} bytes", 513)
        if end < 0:
            return None
        length = _stream_content_length(bytes(self._buffer[:end]))
        total = end + 4 + length
        if total > self._max:
            raise SipParseError(f"message of {total} bytes exceeds the limit of {self._max}", 513)
        if len(self._buffer) < total:
            return None
        message = bytes(self._buffer[:total])
        del self._buffer[:total]
        return message

    def __iter__(self) -> Iterator[bytes]:
        while (message := self.next_message()) is not None:
            yield message


def _stream_content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() in (b"content-length", b"l"):
            text = value.strip()
            if not text.isdigit() or len(text) > 9:
                raise SipParseError(f"Content-Length {text[:20]!r} is not a number")
            return int(text)
    return 0


# ---- header values -------------------------------------------------------------------------


def split_list(value: str) -> list[str]:
    """Split a header value at commas that are outside quotes and ``<>``."""
    parts: list[str] = []
    current: list[str] = []
    in_quotes = in_angle = escaped = False
    for ch in value:
        if escaped:
            escaped = False
        elif in_quotes and ch == "\\":
            escaped = True
        elif ch == '"':
            in_quotes = not in_quotes
        elif not in_quotes and ch == "<":
            in_angle = True
        elif not in_quotes and ch == ">":
            in_angle = False
        elif ch == "," and not in_quotes and not in_angle:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    if in_quotes:
        raise SipParseError(f"unterminated quoted string in {value[:60]!r}")
    parts.append("".join(current).strip())
    return [part for part in parts if part]


def parse_params(text: str) -> dict[str, str | None]:
    """``;tag=abc;lr;q="x"`` -> ``{"tag": "abc", "lr": None, "q": "x"}`` (names lower-cased)."""
    params: dict[str, str | None] = {}
    for part in _split_outside_quotes(text, ";"):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        params[name.strip().lower()] = value if sep else None
    return params


def format_params(params: dict[str, str | None]) -> str:
    return "".join(f";{name}" if value is None else f";{name}={value}" for name, value in params.items())


def _split_outside_quotes(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    in_quotes = False
    for ch in text:
        if ch == '"':
            in_quotes = not in_quotes
        if ch == sep and not in_quotes:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


@dataclass(frozen=True)
class SipUri:
    scheme: str
    user: str | None
    host: str
    port: int | None
    params: dict[str, str | None] = field(default_factory=dict, hash=False)

    @classmethod
    def parse(cls, text: str) -> SipUri:
        scheme, sep, rest = text.strip().partition(":")
        if not sep or scheme.lower() not in ("sip", "sips", "tel"):
            raise SipParseError(f"not a SIP URI: {text[:60]!r}")
        rest = rest.split("?", 1)[0]
        rest, _, param_text = rest.partition(";")
        user: str | None = None
        if "@" in rest:
            user, _, rest = rest.rpartition("@")
            user = user.split(":", 1)[0]
        host, port = _split_hostport(rest, text)
        return cls(scheme.lower(), user, host, port, parse_params(param_text))


def _split_hostport(text: str, context: str) -> tuple[str, int | None]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise SipParseError(f"unterminated IPv6 reference in {context[:60]!r}")
        host, tail = text[: end + 1], text[end + 1 :]
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise SipParseError(f"missing host in {context[:60]!r}")
    if not port_text:
        return host, None
    if not _DIGITS.match(port_text) or not 0 < int(port_text) < 65536:
        raise SipParseError(f"bad port {port_text[:10]!r} in {context[:60]!r}")
    return host, int(port_text)


@dataclass(frozen=True)
class NameAddr:
    """From/To/Contact/Record-Route value: optional display name, URI and header params."""

    display: str | None
    uri: str
    params: dict[str, str | None] = field(default_factory=dict, hash=False)

    @classmethod
    def parse(cls, text: str) -> NameAddr:
        text = text.strip()
        display: str | None = None
        if "<" in text:
            lt = _index_outside_quotes(text, "<")
            gt = text.find(">", lt)
            if lt < 0 or gt < 0:
                raise SipParseError(f"unbalanced <> in {text[:60]!r}")
            display = unquote(text[:lt]) or None
            uri = text[lt + 1 : gt]
            param_text = text[gt + 1 :]
        else:
            uri, _, param_text = text.partition(";")
            param_text = ";" + param_text if param_text else ""
        if not uri or (not param_text.strip().startswith(";") and param_text.strip()):
            raise SipParseError(f"malformed name-addr {text[:60]!r}")
        return cls(display, uri.strip(), parse_params(param_text))

    @property
    def tag(self) -> str | None:
        return self.params.get("tag")

    def with_params(self, **params: str | None) -> NameAddr:
        return NameAddr(self.display, self.uri, {**self.params, **params})

    def __str__(self) -> str:
        display = f'"{self.display}" ' if self.display else ""
        return f"{display}<{self.uri}>{format_params(self.params)}"


def _index_outside_quotes(text: str, char: str) -> int:
    in_quotes = False
    for i, ch in enumerate(text):
        if ch == '"':
            in_quotes = not in_quotes
        elif ch == char and not in_quotes:
            return i
    return -1


@dataclass(frozen=True)
class Via:
    transport: str
    host: str
    port: int | None
    params: dict[str, str | None] = field(default_factory=dict, hash=False)

    @classmethod
    def parse(cls, text: str) -> Via:
        proto, _, rest = text.strip().partition(" ")
        pieces = [p.strip() for p in proto.split("/")]
        if len(pieces) != 3 or pieces[0].upper() != "SIP" or not rest.strip():
            raise SipParseError(f"malformed Via {text[:60]!r}")
        sent_by, _, param_text = rest.strip().partition(";")
        host, port = _split_hostport(sent_by.strip(), text)
        return cls(pieces[2].upper(), host, port, parse_params(param_text))

    @property
    def branch(self) -> str | None:
        return self.params.get("branch")

    def __str__(self) -> str:
        port = f":{self.port}" if self.port else ""
        return f"SIP/2.0/{self.transport} {self.host}{port}{format_params(self.params)}"


def parse_cseq(text: str | None) -> tuple[int, str]:
    number, _, method = (text or "").strip().partition(" ")
    if not _DIGITS.match(number) or not _TOKEN.match(method.strip() or "?"):
        raise SipParseError(f"malformed CSeq {str(text)[:40]!r}")
    return int(number), method.strip()


@dataclass(frozen=True)
class Address:
    """Where a message came from or goes: transport (``udp``/``tcp``/``tls``), host, port."""

    transport: str
    host: str
    port: int
