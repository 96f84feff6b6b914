"""The grammar of SIP header values (RFC 3261 25.1): comma lists, ``;name=value`` params,
quoted strings, URIs, name-addr (From/To/Contact/Route), Via and CSeq, each parsed into a
value and written back by ``str``. Sans-IO; every parse failure raises ``SipParseError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sip.errors import SipParseError

TOKEN = re.compile(r"^[A-Za-z0-9.!%*_+`'~-]+$")
"""An RFC 3261 token (header names, methods)."""
DIGITS = re.compile(r"^[0-9]{1,9}$")
"""A number that fits an int32 (Content-Length, CSeq, ports)."""


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
    if not DIGITS.match(port_text) or not 0 < int(port_text) < 65536:
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
    if not DIGITS.match(number) or not TOKEN.match(method.strip() or "?"):
        raise SipParseError(f"malformed CSeq {str(text)[:40]!r}")
    return int(number), method.strip()
