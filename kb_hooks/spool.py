"""Write-ahead journal of durable events (JSON lines), trimmed once Redis has acknowledged them.

Layout: ``events.jsonl`` holds one record per line: an event record (``{"id", "prefix",
"event"}``) or a checkpoint (``{"checkpoint": {...}}``, written first after a compaction so
that what the dropped prefix said about still-active calls survives). ``events.offset`` holds
the byte offset up to which records are acknowledged; a stale offset only replays records
again, which the publisher's Redis script de-duplicates by ``event_id``.

Durability (``spool_fsync``): ``batch`` fsyncs after every appended batch (group commit), so
what ``append`` returned survives a power failure; ``never`` leaves that to the OS (a killed
process still loses nothing that ``append`` returned). A torn last line (a crash during a
write) is cut off when the journal is opened and counted in ``torn_records``.

Compaction: when the acknowledged prefix reaches ``compact_bytes`` and is at least as large
as the pending rest, or when an append would not fit under ``max_bytes``, the journal is
rewritten as one checkpoint line plus the pending records (atomically: temporary file,
fsync, rename) and ``generation`` increases, so offsets of the old file are refused.

Thread-safety: every method takes the journal's lock; the publisher calls them from a worker
thread so that an fsync never stalls the event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

SPOOL_FILE = "events.jsonl"
OFFSET_FILE = "events.offset"
LOCK_FILE = "events.lock"


class SpoolInUseError(RuntimeError):
    """Another live process journals into the same spool directory."""


COMPACT_BYTES = 4 << 20  # an acknowledged prefix this large is worth a rewrite


class Spool:
    """An append-only record file with an acknowledged-offset, shared by two threads under a lock."""

    def __init__(self, directory: Path, max_bytes: int, fsync: bool = True, compact_bytes: int = COMPACT_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.compact_bytes = compact_bytes
        self.path = directory / SPOOL_FILE
        self.offset_path = directory / OFFSET_FILE
        self.torn_records = 0
        self.generation = 0
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        # One process per journal: the kernel drops the lock when its holder dies, even by SIGKILL.
        self._lock_file = (directory / LOCK_FILE).open("a")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise SpoolInUseError(
                f"spool directory {directory} is in use by another running process; give each service "
                "process its own redis.spool_dir"
            ) from None
        self._size = self._repair()
        self._offset = self._read_offset()
        self._saved_offset = self._offset

    def _repair(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("r+b") as fh:
            data = fh.read()
            end = data.rfind(b"\n") + 1
            if end != len(data):
                self.torn_records += 1
                fh.truncate(end)
        return end

    def _read_offset(self) -> int:
        try:
            offset = int(self.offset_path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0
        return offset if 0 <= offset <= self._size else 0

    @property
    def size(self) -> int:
        return self._size

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def pending_bytes(self) -> int:
        return self._size - self._offset

    def has_pending(self) -> bool:
        return self._size > self._offset

    def scan(self) -> Iterator[tuple[str, int]]:
        """Every record with the offset just after it, acknowledged or not (start-up recovery,
        before any other thread uses the journal)."""
        if self._size == 0:
            return
        with self.path.open("rb") as fh:
            offset = 0
            for raw in fh:
                offset += len(raw)
                yield raw.decode("utf-8", errors="replace").rstrip("\n"), offset

    def fits(self, incoming_bytes: int) -> bool:
        return self._size + incoming_bytes <= self.max_bytes

    def append(self, lines: list[str]) -> list[int]:
        """Append records (no newlines inside) as one write and one fsync; return the end offset
        of each record written (a prefix of ``lines``: those that fit under ``max_bytes``)."""
        with self._lock:
            blobs: list[bytes] = []
            ends: list[int] = []
            size = self._size
            for line in lines:
                blob = line.encode() + b"\n"
                if size + len(blob) > self.max_bytes:
                    break
                blobs.append(blob)
                size += len(blob)
                ends.append(size)
            if blobs:
                with self.path.open("ab") as fh:
                    fh.write(b"".join(blobs))
                    fh.flush()
                    if self.fsync:
                        os.fsync(fh.fileno())
                self._size = size
            return ends

    def read(self, generation: int, start: int, stop: int, max_records: int) -> tuple[list[str], int]:
        """Up to ``max_records`` records between byte offsets ``start`` and ``stop`` and the offset
        just after them; nothing when ``generation`` is no longer the journal's (it was compacted)."""
        with self._lock:
            if generation != self.generation or start >= min(stop, self._size):
                return [], start
            lines: list[str] = []
            offset = start
            stop = min(stop, self._size)
            with self.path.open("rb") as fh:
                fh.seek(offset)
                while len(lines) < max_records and offset < stop:
                    raw = fh.readline()
                    if not raw:
                        break
                    offset += len(raw)
                    lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
            return lines, offset

    def acknowledge(self, generation: int, offset: int) -> None:
        """Records before ``offset`` of journal ``generation`` are in Redis; saves the offset."""
        with self._lock:
            if generation == self.generation and self._offset < offset <= self._size:
                self._offset = offset
            if self._offset != self._saved_offset:
                self._save_offset(self._offset)

    def _save_offset(self, offset: int) -> None:
        tmp = self.offset_path.with_name(OFFSET_FILE + ".tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, self.offset_path)
        self._saved_offset = offset

    def should_compact(self, incoming_bytes: int) -> bool:
        acked = self._offset
        if acked >= self.compact_bytes and self.pending_bytes <= acked:
            return True
        return acked > 0 and not self.fits(incoming_bytes)

    def compact(self, head: list[str]) -> int:
        """Rewrite the journal as ``head`` + the pending records; return records dropped (none
        unless ``head`` + pending exceed ``max_bytes``). Offsets restart at 0 in a new generation."""
        with self._lock:
            pending: list[bytes] = []
            if self.has_pending():
                with self.path.open("rb") as fh:
                    fh.seek(self._offset)
                    pending = fh.read(self._size - self._offset).splitlines(keepends=True)
            records = [line.encode() + b"\n" for line in head] + pending
            tmp = self.path.with_name(SPOOL_FILE + ".tmp")
            kept = size = 0
            with tmp.open("wb") as fh:
                for blob in records:
                    if size + len(blob) > self.max_bytes:
                        break
                    fh.write(blob)
                    size += len(blob)
                    kept += 1
                fh.flush()
                if self.fsync:
                    os.fsync(fh.fileno())
            # Offset 0 first: a crash before the rename then replays the old file from its start
            # (duplicates, which Redis refuses), never skips a record of the new one.
            self._save_offset(0)
            os.replace(tmp, self.path)
            self._size, self._offset = size, 0
            self.generation += 1
            return len(records) - kept

    def close(self) -> None:
        """Release the directory for the next process."""
        self._lock_file.close()

    def clear(self) -> None:
        """Remove both files (everything acknowledged and nothing worth a checkpoint)."""
        with self._lock:
            for path in (self.path, self.offset_path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self._size = self._offset = self._saved_offset = 0
            self.generation += 1
