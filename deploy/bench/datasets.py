"""Test sets as users have them: what ``asr-bench accuracy --testset`` reads.

Three layouts, told apart by what the path holds:

- a **Kaldi/WeNet data directory**: ``wav.scp`` (``<id> <path>``) and ``text`` (``<utt_id>
  <transcript>``), and ``segments`` (``<utt_id> <recording_id> <begin_s> <end_s>``) when the
  utterances are parts of longer recordings (then ``wav.scp``'s ids are recording ids);
- WeNet's **``data.list``** (the raw format): a file of JSON lines
  ``{"key": ..., "wav": ..., "txt": ...}``;
- a **directory of WAVs** named ``<utt_id>.wav`` beside ``text`` (the demo recipe's test sets).

Relative audio paths are taken from the current directory when a file is there (Kaldi's
convention: paths relative to the recipe's root), else from the directory of the list that
names them. Audio is 16-bit PCM mono WAV at any rate (8 and 16 kHz for call audio); ``wav.scp``
commands (``sox ... |``) and WeNet's shard lists (tar archives) are refused with what to do
instead. Utterances are in the order of ``text`` (``data.list``: its lines).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Layout = Literal["kaldi", "data.list", "wav-dir"]


class DataSetError(ValueError):
    """A test set that cannot be read; the message names the file (and line) and what to do."""


@dataclass(frozen=True)
class ScoredUtterance:
    """One scored utterance: ``wav[begin_s:end_s]`` (the whole file when ``end_s`` is None)."""

    utt_id: str
    text: str
    wav: Path
    begin_s: float = 0.0
    end_s: float | None = None


@dataclass(frozen=True)
class DataSet:
    name: str  # the directory's or list's name, as reports show it
    path: Path
    layout: Layout
    utterances: tuple[ScoredUtterance, ...]


def load_dataset(path: Path) -> DataSet:
    """The utterances of the test set at ``path`` (a data directory, a ``data.list`` file or a
    WAV directory with ``text``). Raises DataSetError."""
    if path.is_file():
        return DataSet(path.parent.name if path.name == "data.list" else path.stem, path, "data.list", _data_list(path))
    if not path.is_dir():
        raise DataSetError(f"{path}: no such test set (a data directory, a data.list file or a WAV directory)")
    if (path / "wav.scp").is_file():
        return DataSet(path.name, path, "kaldi", _kaldi_dir(path))
    if (path / "data.list").is_file():
        return DataSet(path.name, path, "data.list", _data_list(path / "data.list"))
    if (path / "text").is_file():
        texts = _table(path / "text", 2)
        return DataSet(
            path.name, path, "wav-dir", tuple(ScoredUtterance(i, t, path / f"{i}.wav") for i, t in texts.items())
        )
    raise DataSetError(f"{path}: holds neither wav.scp, data.list nor text; see docs/measure-accuracy.md")


def _table(path: Path, fields: int) -> dict[str, str]:
    """``<id> <rest>`` per non-empty line (the rest may hold spaces when ``fields`` is 2)."""
    rows: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        key, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if fields > 2 and len(rest.split()) != fields - 1:
            raise DataSetError(f"{path}:{number}: expected {fields} fields, got {line!r}")
        if key in rows:
            raise DataSetError(f"{path}:{number}: {key!r} appears twice")
        rows[key] = rest
    return rows


def _audio_path(value: str, listed_in: Path, where: str) -> Path:
    if value.endswith("|"):
        raise DataSetError(
            f"{where}: a command ({value}) is not run; write its output to a WAV file and list that file"
        )
    path = Path(value)
    if path.is_absolute() or path.exists():
        return path
    return listed_in.parent / path


def _kaldi_dir(path: Path) -> tuple[ScoredUtterance, ...]:
    scp_path = path / "wav.scp"
    scp = {key: _audio_path(value, scp_path, f"{scp_path}: {key}") for key, value in _table(scp_path, 2).items()}
    texts = _table(path / "text", 2) if (path / "text").is_file() else {}
    if not texts:
        raise DataSetError(f"{path / 'text'}: missing or empty; it holds the reference transcripts")
    segments = _table(path / "segments", 4) if (path / "segments").is_file() else None
    utterances = []
    for utt_id, text in texts.items():
        if segments is None:
            wav, begin, end = scp.get(utt_id), 0.0, None
            owner = utt_id
        else:
            if utt_id not in segments:
                raise DataSetError(f"{path / 'segments'}: no segment for {utt_id!r} of text")
            owner, begin_s, end_s = segments[utt_id].split()
            wav, begin, end = scp.get(owner), float(begin_s), float(end_s)
            if not 0 <= begin < end:
                raise DataSetError(f"{path / 'segments'}: {utt_id}: begin {begin_s} s is not before end {end_s} s")
        if wav is None:
            raise DataSetError(f"{scp_path}: no audio for {owner!r} (named in {'segments' if segments else 'text'})")
        utterances.append(ScoredUtterance(utt_id, text, wav, begin, end))
    return tuple(utterances)


def _data_list(path: Path) -> tuple[ScoredUtterance, ...]:
    utterances = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if line.strip().endswith((".tar", ".tar.gz")):
                raise DataSetError(
                    f'{where}: a shard list (tar archives); give the raw data.list ({{"key", "wav", "txt"}} lines)'
                ) from None
            raise DataSetError(f"{where}: not a JSON line with key, wav and txt") from None
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("key", "wav", "txt")):
            raise DataSetError(f'{where}: expected {{"key": ..., "wav": ..., "txt": ...}} (strings)')
        utterances.append(ScoredUtterance(entry["key"], entry["txt"], _audio_path(entry["wav"], path, where)))
    if not utterances:
        raise DataSetError(f"{path}: no utterances")
    return tuple(utterances)
