"""Unpack a model archive (.tar.gz/.tgz/.tar/.zip) without trusting it.

Refused, with the member named: absolute paths and ``..`` components (path traversal),
device files and FIFOs, links that point outside the archive, members past the per-file or
total size limits or the member count, and archives that end early or fail their checksums
(gzip/zip CRC). Links that stay inside the archive (WeNet's training writes ``final.pt`` as a
link to the last epoch's checkpoint) are unpacked as copies of their target. Nothing is
written outside ``dest``; modes come from us (0644 files, 0755 directories), never from the
archive, so no set-uid bits or read-only trees arrive with it.
"""

from __future__ import annotations

import lzma
import posixpath
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from deploy.models.errors import ModelStoreError

COPY_BLOCK = 1 << 20
ZIP_EOCD = b"PK\x05\x06"
ZIP_EOCD_SEARCH = 22 + 0xFFFF  # the record and the longest comment it may carry


@dataclass(frozen=True, slots=True)
class UnpackLimits:
    """Bytes per member, bytes in all, and members (a zip bomb stops at the first limit hit)."""

    max_file_bytes: int = 4 << 30
    max_total_bytes: int = 8 << 30
    max_members: int = 10_000


DEFAULT_UNPACK_LIMITS = UnpackLimits()


@dataclass(frozen=True, slots=True)
class _Link:
    name: str  # archive path of the link
    target: str  # archive path of what it points at


def archive_kind(path: Path) -> str:
    """``"tar"`` (plain or gzip/bz2/xz-compressed) or ``"zip"``, from the file's first bytes."""
    with path.open("rb") as handle:
        head = handle.read(262)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")) or head[257:262] == b"ustar":
        return "tar"
    raise ModelStoreError(f"{path}: not a .tar.gz, .tgz, .tar or .zip archive (unrecognised first bytes)")


def unpack(archive: Path, dest: Path, limits: UnpackLimits = DEFAULT_UNPACK_LIMITS) -> None:
    """Unpack ``archive`` into the empty or absent directory ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    unpacker = _Unpacker(archive, dest, limits)
    try:
        if archive_kind(archive) == "zip":
            unpacker.zip()
        else:
            unpacker.tar()
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError) as exc:
        raise ModelStoreError(
            f"{archive}: truncated or corrupt archive ({exc or type(exc).__name__}); fetch or copy it again"
        ) from None
    except (FileExistsError, NotADirectoryError) as exc:
        raise ModelStoreError(f"{archive}: refused: members conflict at {exc.filename}") from None
    except OSError as exc:
        if exc.errno is None:  # gzip's BadGzipFile and similar: the bytes, not the disk
            raise ModelStoreError(f"{archive}: corrupt archive ({exc}); fetch or copy it again") from None
        raise


def _check_zip_end(path: Path) -> None:
    """A zip ends with its end-of-central-directory record (22 bytes + its comment). zipfile
    searches back for one, and in a zip cut short it finds the record of a zip stored inside
    (``final.pt`` is one): the cut archive would then look like a different, whole one."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        handle.seek(max(0, size - ZIP_EOCD_SEARCH))
        tail = handle.read()
    at = tail.rfind(ZIP_EOCD)
    if at < 0 or at + 22 > len(tail):
        raise zipfile.BadZipFile("no end-of-central-directory record at the end: the file was cut short")
    comment_length = int.from_bytes(tail[at + 20 : at + 22], "little")
    if at + 22 + comment_length != len(tail):
        raise zipfile.BadZipFile("the end-of-central-directory record is not at the end: the file was cut short")


class _Unpacker:
    def __init__(self, archive: Path, dest: Path, limits: UnpackLimits) -> None:
        self.archive = archive
        self.dest = dest
        self.limits = limits
        self.total = 0
        self.members = 0
        self.files: set[str] = set()
        self.links: list[_Link] = []

    def tar(self) -> None:
        with tarfile.open(self.archive, mode="r:*") as tar:
            for member in tar:  # streamed: a member's data is read before the next header
                name = self._checked_name(member.name)
                if member.isdir():
                    self._mkdir(name)
                elif member.isfile():
                    self._check_size(name, member.size)
                    source = tar.extractfile(member)
                    assert source is not None  # regular members always have data
                    self._write(name, source)
                elif member.issym():
                    self._add_link(name, posixpath.join(posixpath.dirname(name), member.linkname), member.linkname)
                elif member.islnk():
                    self._add_link(name, member.linkname, member.linkname)
                else:
                    raise ModelStoreError(
                        f"{self.archive}: refused: {member.name!r} is a device file or FIFO; a model archive "
                        "holds regular files only"
                    )
        self._resolve_links()

    def zip(self) -> None:
        _check_zip_end(self.archive)
        with zipfile.ZipFile(self.archive) as archive:
            for info in archive.infolist():
                name = self._checked_name(info.filename)
                if (info.external_attr >> 16) & 0o170000 == 0o120000:  # a Unix symlink stored by zip
                    target = archive.read(info).decode("utf-8", "replace")
                    self._add_link(name, posixpath.join(posixpath.dirname(name), target), target)
                elif info.is_dir():
                    self._mkdir(name)
                else:
                    self._check_size(name, info.file_size)
                    with archive.open(info) as source:  # CRC checked as it is read
                        self._write(name, source)
        self._resolve_links()

    def _checked_name(self, raw: str) -> str:
        """The member's normalised relative path, or refuse it."""
        self.members += 1
        if self.members > self.limits.max_members:
            raise ModelStoreError(f"{self.archive}: refused: more than {self.limits.max_members} members")
        name = raw.replace("\\", "/")
        if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            raise ModelStoreError(f"{self.archive}: refused: member {raw!r} has an absolute path")
        parts = [part for part in name.split("/") if part not in ("", ".")]
        if ".." in parts:
            raise ModelStoreError(f"{self.archive}: refused: member {raw!r} climbs out of the archive (..)")
        if not parts:
            return "."
        return "/".join(parts)

    def _check_size(self, name: str, size: int) -> None:
        if size > self.limits.max_file_bytes:
            raise ModelStoreError(
                f"{self.archive}: refused: {name} is {size} bytes, "
                f"over the {self.limits.max_file_bytes}-byte limit per file"
            )

    def _path(self, name: str) -> Path:
        return self.dest / name if name != "." else self.dest

    def _mkdir(self, name: str) -> None:
        path = self._path(name)
        if path.exists() and not path.is_dir():
            raise ModelStoreError(f"{self.archive}: refused: {name} is both a file and a directory")
        path.mkdir(mode=0o755, parents=True, exist_ok=True)

    def _write(self, name: str, source: IO[bytes]) -> None:
        """Copy a member's bytes, counting them as they come (sizes in headers can lie)."""
        if name in self.files or name == ".":
            raise ModelStoreError(f"{self.archive}: refused: {name} appears twice")
        path = self._path(name)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        written = 0
        with path.open("xb") as out:
            while block := source.read(COPY_BLOCK):
                written += len(block)
                self.total += len(block)
                if written > self.limits.max_file_bytes:
                    self._check_size(name, written)
                if self.total > self.limits.max_total_bytes:
                    raise ModelStoreError(
                        f"{self.archive}: refused: more than {self.limits.max_total_bytes} bytes unpacked in all"
                    )
                out.write(block)
        path.chmod(0o644)
        self.files.add(name)

    def _add_link(self, name: str, target: str, as_written: str) -> None:
        resolved = posixpath.normpath(target)
        if as_written.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise ModelStoreError(f"{self.archive}: refused: link {name} -> {as_written} points outside the archive")
        self.links.append(_Link(name, resolved))

    def _resolve_links(self) -> None:
        """Each link inside the archive becomes a copy of the regular file it names."""
        for link in self.links:
            target = link.target
            seen = {link.name}
            while target not in self.files:
                hop = next((other for other in self.links if other.name == target), None)
                if hop is None or hop.name in seen:
                    raise ModelStoreError(
                        f"{self.archive}: refused: link {link.name} -> {link.target} names no file in the archive"
                    )
                seen.add(hop.name)
                target = hop.target
            with self._path(target).open("rb") as source:
                self._write(link.name, source)
