"""Cutting a TCP/TLS byte stream into SIP messages (RFC 3261 18.3), by each message's
Content-Length; ``sip.message.parse`` then parses each one. Sans-IO: bytes in, bytes out."""

from __future__ import annotations

from collections.abc import Iterator

from sip.errors import SipParseError


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
