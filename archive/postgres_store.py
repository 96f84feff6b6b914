"""The archive in PostgreSQL (psycopg 3): pg_trgm GIN indexes make ``LIKE '%phrase%'`` an index
search. The database must exist; the store creates its tables and the pg_trgm extension (a
trusted extension since PostgreSQL 13: the database's owner may create it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from archive.migrations import Dialect
from archive.rows import DEFAULT_AGENT_ID_KEY
from archive.sql import Cursor, SqlStore, like_pattern
from archive.store import ArchiveError


class PostgresStore(SqlStore):
    dialect: Dialect = "postgresql"
    _for_update = " FOR UPDATE"

    def __init__(self, url: str, agent_id_key: str = DEFAULT_AGENT_ID_KEY) -> None:
        super().__init__(agent_id_key)
        try:
            import psycopg
        except ImportError as exc:
            raise ArchiveError("a postgresql:// archive needs psycopg: pip install 'psycopg[binary]'") from exc
        try:
            self._db = psycopg.connect(url, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise ArchiveError(f"cannot connect to the archive database: {exc}") from exc
        self.migrate()

    @contextmanager
    def _transaction(self) -> Iterator[Cursor]:
        with self._db.transaction(), self._db.cursor() as cur:
            yield cur

    def _sql(self, statement: str) -> str:
        return statement.replace("?", "%s")

    def _phrase_clause(self, phrase: str) -> tuple[str, list[Any]]:
        return ("c.call_id IN (SELECT f.call_id FROM finals f WHERE f.text LIKE ? ESCAPE '\\')", [like_pattern(phrase)])

    def close(self) -> None:
        self._db.close()
