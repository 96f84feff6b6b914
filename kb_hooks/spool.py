"""Append-only local spool of events that Redis could not take yet (JSON lines).

Layout: ``events.jsonl`` holds one record per line, ``events.offset`` the byte offset up to
which records have been acknowledged by Redis. Records are replayed in file order; once all
of them are acknowledged both files are removed. Durability (``spool_fsync``): ``batch``
fsyncs the file after every batch of appended records, so at most the batch being written is
lost on power failure; ``never`` leaves it to the OS. A torn last line (crash mid-write) is
cut off when the spool is opened.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SPOOL_FILE = "events.jsonl"
OFFSET_FILE = "events.offset"


class Spool:
    """Single-threaded (the publisher's event loop); every method is short blocking file I/O."""

    def __init__(self, directory: Path, max_bytes: int, fsync: bool = True) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.path = directory / SPOOL_FILE
        self.offset_path = directory / OFFSET_FILE
        directory.mkdir(parents=True, exist_ok=True)
        self._size = self._repair()
        self._offset = self._read_offset()

    def _repair(self) -> int:
        if not self.path.exists():
            return 0
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with self.path.open("r+b") as fh:
                fh.truncate(end)
        return end

    def _read_offset(self) -> int:
        try:
            offset = int(self.offset_path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0
        return offset if 0 <= offset <= self._size else 0

    @property
    def pending_bytes(self) -> int:
        return self._size - self._offset

    def has_pending(self) -> bool:
        return self._size > self._offset

    def append(self, lines: list[str]) -> int:
        """Append records (no newlines inside); return how many fit under ``max_bytes``."""
        blobs: list[bytes] = []
        size = self._size
        for line in lines:
            blob = line.encode() + b"\n"
            if size + len(blob) > self.max_bytes:
                break
            blobs.append(blob)
            size += len(blob)
        if blobs:
            with self.path.open("ab") as fh:
                fh.write(b"".join(blobs))
                fh.flush()
                if self.fsync:
                    os.fsync(fh.fileno())
            self._size = size
        return len(blobs)

    def read(self, max_records: int) -> tuple[list[str], int]:
        """Up to ``max_records`` unacknowledged records and the offset just after them."""
        if not self.has_pending():
            return [], self._offset
        lines: list[str] = []
        offset = self._offset
        with self.path.open("rb") as fh:
            fh.seek(offset)
            while len(lines) < max_records and offset < self._size:
                raw = fh.readline()
                offset += len(raw)
                lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
        return lines, offset

    def commit(self, offset: int) -> None:
        """Records before ``offset`` are acknowledged; the spool empties itself when all are."""
        self._offset = offset
        if self._offset >= self._size:
            self.clear()
            return
        tmp = self.offset_path.with_suffix(".tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, self.offset_path)

    def clear(self) -> None:
        for path in (self.path, self.offset_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._size = self._offset = 0

    def rewrite(self, head: list[str], tail: list[str]) -> int:
        """Atomically replace the spool by ``head`` + pending records + ``tail``; return records dropped."""
        pending, _ = self.read(1 << 62)
        records = head + pending + tail
        tmp = self.path.with_suffix(".tmp")
        kept = 0
        size = 0
        with tmp.open("wb") as fh:
            for line in records:
                blob = line.encode() + b"\n"
                if size + len(blob) > self.max_bytes:
                    break
                fh.write(blob)
                size += len(blob)
                kept += 1
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        with contextlib.suppress(FileNotFoundError):
            self.offset_path.unlink()
        self._size, self._offset = size, 0
        if size == 0:
            self.clear()
        return len(records) - kept
