"""The archive in one SQLite file: WAL (readers never wait for the archiver), FTS5 trigram
phrase search. Needs SQLite >= 3.34 (the trigram tokenizer); Python's sqlite3 says which it has."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from archive.migrations import Dialect
from archive.rows import DEFAULT_AGENT_ID_KEY
from archive.sql import Cursor, SqlStore, like_pattern
from archive.store import ArchiveError

TRIGRAM_SINCE = (3, 34, 0)
TRIGRAM_MIN_CHARS = 3  # the trigram index finds runs of 3 or more characters; shorter ones are scanned


class SqliteStore(SqlStore):
    dialect: Dialect = "sqlite"
    # FTS5 finds every final with a phrase before the newest page is taken: 0.4-0.5 s for a phrase
    # in 10 % of 100,000 calls (docs/BENCHMARKS.md, 2026-12-07); the newest calls read first.
    _phrase_window = 2000

    def __init__(self, path: str, agent_id_key: str = DEFAULT_AGENT_ID_KEY) -> None:
        super().__init__(agent_id_key)
        if sqlite3.sqlite_version_info < TRIGRAM_SINCE:
            raise ArchiveError(f"SQLite {sqlite3.sqlite_version} has no FTS5 trigram tokenizer (3.34 or later needed)")
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")  # WAL: a power cut loses at most the last commits
        except sqlite3.Error as exc:
            raise ArchiveError(f"cannot open the archive {path}: {exc}") from exc
        self.migrate()

    @contextmanager
    def _transaction(self) -> Iterator[Cursor]:
        cur = self._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    def _phrase_clause(self, phrase: str) -> tuple[str, list[Any]]:
        if len(phrase) < TRIGRAM_MIN_CHARS:
            return (
                "c.call_id IN (SELECT f.call_id FROM finals f WHERE f.text LIKE ? ESCAPE '\\')",
                [like_pattern(phrase)],
            )
        quoted = '"' + phrase.replace('"', '""') + '"'
        return (
            "c.call_id IN (SELECT f.call_id FROM finals_fts JOIN finals f ON f.id = finals_fts.rowid "
            "WHERE finals_fts MATCH ?)",
            [quoted],
        )

    def close(self) -> None:
        self._db.close()
