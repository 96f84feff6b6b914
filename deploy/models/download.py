"""Fetch one file over HTTP(S): resumable, size-capped, checksummed, with progress on stderr.

The bytes land in ``<target>.part``; a transfer that breaks (the connection drops, the
process is killed) is continued from the end of that file with an HTTP ``Range`` request, by
the next attempt of this call or by the next ``pull``. Only a complete file (the size the
server announced, and the SHA-256 when one is known) is renamed to ``target``.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO

from deploy.models.errors import ModelStoreError

BLOCK_BYTES = 1 << 20
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
UNSATISFIED_RANGE = re.compile(r"bytes \*/(\d+)")
USER_AGENT = "hotline-asr asr-model"
CANNOT_CONNECT = "cannot connect"


@dataclass(frozen=True, slots=True)
class DownloadLimits:
    """``max_bytes``: the largest file accepted (bytes); ``attempts``: tries per URL, each
    resuming where the previous stopped; ``timeout_s``: seconds a read may wait."""

    max_bytes: int = 8 << 30
    attempts: int = 4
    timeout_s: float = 60.0


DEFAULT_DOWNLOAD_LIMITS = DownloadLimits()


class _Interrupted(Exception):
    """The transfer stopped early; the next attempt resumes from the partial file."""


class Progress:
    """A progress line on ``stream``: rewritten in place on a terminal, else one line per 10 %."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream = stream
        self.label = label
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.start_bytes = 0
        self.last_decile = -1

    def begin(self, done: int) -> None:
        self.started = time.monotonic()
        self.start_bytes = done

    def update(self, done: int, total: int | None) -> None:
        rate = (done - self.start_bytes) / max(time.monotonic() - self.started, 1e-3) / 1e6
        if total:
            decile = done * 10 // total
            if not self.tty and decile == self.last_decile:
                return
            self.last_decile = decile
            line = f"{self.label}: {done / 1e6:.1f} / {total / 1e6:.1f} MB ({100 * done // total} %), {rate:.1f} MB/s"
        else:
            line = f"{self.label}: {done / 1e6:.1f} MB, {rate:.1f} MB/s"
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def download(
    urls: Sequence[str],
    target: Path,
    *,
    sha256: str = "",
    limits: DownloadLimits = DEFAULT_DOWNLOAD_LIMITS,
    progress: TextIO,
) -> Path:
    """Fetch the first of ``urls`` that answers into ``target`` (its directory must exist).

    Raises ``ModelStoreError`` when no URL gives a complete file, when the file is larger than
    ``limits.max_bytes``, or when ``sha256`` is given and does not match (the partial file is
    then removed: resuming it could only give the same bytes)."""
    part = target.with_name(target.name + ".part")
    problems: dict[str, str] = {}  # url -> why its last try failed
    for url in urls:
        meter = Progress(progress, target.name)
        for _attempt in range(limits.attempts):
            try:
                _fetch_once(url, part, limits, meter)
            except _Interrupted as exc:
                problems[url] = str(exc)
                continue
            except ModelStoreError as exc:
                problems[url] = str(exc)
                break
            meter.end()
            _verify(part, sha256)
            part.replace(target)
            return target
        meter.end()
    kept = f"; the partial file {part} is kept and the next pull resumes it" if part.exists() else ""
    tried = "; ".join(f"{url}: {why}" for url, why in problems.items())
    offline = all(why.startswith(CANNOT_CONNECT) for why in problems.values())
    hint = "; offline? fetch the archive on a connected machine and use asr-model install" if offline else ""
    raise ModelStoreError(f"could not fetch {target.name} ({tried}){kept}{hint}")


def _verify(part: Path, sha256: str) -> None:
    if not sha256:
        return
    actual = sha256_of(part)
    if actual != sha256:
        part.unlink()
        raise ModelStoreError(
            f"{part.name}: checksum mismatch (SHA-256 {actual}, the catalogue says {sha256}); the file was "
            "removed: pull again, and if it fails the same way the mirror serves a different file"
        )


def _fetch_once(url: str, part: Path, limits: DownloadLimits, meter: Progress) -> None:
    """One GET continuing ``part``; returns when it holds the whole file."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=limits.timeout_s)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have and _range_was_complete(exc.headers.get("Content-Range", ""), have):
            return
        if exc.code == 416:
            part.unlink()  # our partial file is longer than the file: start again
            raise _Interrupted("the partial file did not fit the server's file; starting again") from None
        raise ModelStoreError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:  # no answer at all: the next mirror, not a retry
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise ModelStoreError(f"{CANNOT_CONNECT} ({reason})") from None
    with response:
        if response.status == 206:
            start, total = _content_range(response.headers.get("Content-Range", ""))
            if start != have:
                raise ModelStoreError(f"asked for bytes from {have}, the server sent from {start}")
            mode = "ab"
        else:
            have, mode = 0, "wb"  # 200: the server ignored the range, the body is the whole file
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        if total is not None and total > limits.max_bytes:
            raise ModelStoreError(
                f"{total} bytes, more than the {limits.max_bytes} accepted (--max-bytes raises the limit)"
            )
        meter.begin(have)
        with part.open(mode) as out:
            have = _copy_body(response, out, have, total, limits, meter)
    if total is not None and have < total:
        raise _Interrupted(f"the connection closed after {have} of {total} bytes")


def _copy_body(
    response: http.client.HTTPResponse, out: IO[bytes], have: int, total: int | None, limits: DownloadLimits,
    meter: Progress,
) -> int:  # fmt: skip
    """Append the body to ``out``; returns the bytes the partial file now holds."""
    while True:
        try:
            block = response.read(BLOCK_BYTES)
        except (http.client.IncompleteRead, OSError) as exc:
            if isinstance(exc, http.client.IncompleteRead):
                out.write(exc.partial)
                have += len(exc.partial)
            out.flush()
            raise _Interrupted(f"the transfer broke after {have} bytes ({type(exc).__name__})") from None
        if not block:
            return have
        out.write(block)
        have += len(block)
        if have > limits.max_bytes:
            raise ModelStoreError(f"more than the {limits.max_bytes} bytes accepted (--max-bytes raises the limit)")
        meter.update(have, total)


def _content_range(header: str) -> tuple[int, int | None]:
    """``bytes START-END/TOTAL`` -> (START, TOTAL or None when the server gives ``*``)."""
    match = CONTENT_RANGE.fullmatch(header.strip())
    if match is None:
        raise ModelStoreError(f"a 206 answer without a usable Content-Range ({header!r})")
    return int(match.group(1)), None if match.group(3) == "*" else int(match.group(3))


def _range_was_complete(header: str, have: int) -> bool:
    """416 with ``bytes */TOTAL`` and TOTAL == what we have: the partial file is the whole file."""
    match = UNSATISFIED_RANGE.fullmatch(header.strip())
    return match is not None and int(match.group(1)) == have
