"""The archive over SQL: one implementation of ``ArchiveStore`` for SQLite and PostgreSQL.

The statements are written once, with ``?`` placeholders (PostgreSQL's driver gets ``%s``);
what differs by dialect (connecting, transactions, phrase search) is in the two subclasses.
Every public method holds the store's lock, so one store may serve several threads (the
console calls it from a thread pool).
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from archive.migrations import MIGRATIONS, Dialect
from archive.rows import DEFAULT_AGENT_ID_KEY, EventRows, rows_of
from archive.store import MAX_PAGE_SIZE, AccessEntry, CallHit, CallQuery, CallRecord, Page
from kb_hooks.events import utc_timestamp

TABLES = ("calls", "events", "finals", "kb_cards", "tags", "workorders", "analytics", "access_log")
Cursor = Any  # sqlite3.Cursor or psycopg.Cursor: the DB-API calls used here are common to both


def like_pattern(text: str) -> str:
    """``%text%`` for ``LIKE ... ESCAPE '\\'``, the wildcards in ``text`` taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class SqlStore(ABC):
    dialect: Dialect
    _for_update = ""
    _phrase_window = 0  # calls read newest first for a phrase before its index is asked (0: never)

    def __init__(self, agent_id_key: str = DEFAULT_AGENT_ID_KEY) -> None:
        self.agent_id_key = agent_id_key
        self._lock = threading.Lock()

    # -- what each dialect supplies ----------------------------------------------------------

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Cursor]:
        """A cursor inside one transaction: committed on leaving, rolled back on an error."""

    @abstractmethod
    def _phrase_clause(self, phrase: str) -> tuple[str, list[Any]]:
        """A condition on ``c.call_id``: some final of the call contains ``phrase``."""

    def _sql(self, statement: str) -> str:
        return statement

    def _execute(self, cur: Cursor, statement: str, params: Sequence[Any] = ()) -> Cursor:
        cur.execute(self._sql(statement), params)
        return cur

    # -- schema ------------------------------------------------------------------------------

    def migrate(self) -> None:
        with self._lock:
            with self._transaction() as cur:
                self._execute(cur, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                if self._execute(cur, "SELECT version FROM schema_version").fetchone() is None:
                    self._execute(cur, "INSERT INTO schema_version (version) VALUES (0)")
            for step in MIGRATIONS:
                with self._transaction() as cur:
                    # PostgreSQL: FOR UPDATE makes a second process starting at once wait, then skip
                    (current,) = self._execute(cur, "SELECT version FROM schema_version" + self._for_update).fetchone()
                    if current >= step.version:
                        continue
                    for statement in step.statements[self.dialect]:
                        cur.execute(statement)
                    self._execute(cur, "UPDATE schema_version SET version = ?", (step.version,))

    def schema_version(self) -> int:
        with self._lock, self._transaction() as cur:
            return int(self._execute(cur, "SELECT version FROM schema_version").fetchone()[0])

    # -- writing -----------------------------------------------------------------------------

    def apply(self, events: Sequence[Mapping[str, Any]]) -> int:
        new = 0
        with self._lock, self._transaction() as cur:
            for event in events:
                rows = rows_of(event, self.agent_id_key)
                if rows is not None and self._apply_one(cur, rows):
                    new += 1
        return new

    def _apply_one(self, cur: Cursor, rows: EventRows) -> bool:
        ex = self._execute
        ex(
            cur,
            "INSERT INTO events (event_id, call_id, event_type) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (rows.event_id, rows.call_id, rows.event_type),
        )
        if cur.rowcount != 1:
            return False  # applied before: an at-least-once redelivery
        call = rows.call_id
        ex(
            cur,
            "INSERT INTO calls (call_id, route, started_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (call, rows.route, rows.ts),
        )
        if (s := rows.started) is not None:
            ex(
                cur,
                "UPDATE calls SET route = COALESCE(?, route), source = ?, source_call_id = ?, agent = ?, "
                "participants = ?, metadata = ?, started_at = ? WHERE call_id = ?",
                (rows.route, s.source, s.source_call_id, s.agent, s.participants, s.metadata, rows.ts, call),
            )
        if (e := rows.ended) is not None:
            ex(
                cur,
                "UPDATE calls SET ended_at = ?, end_reason = ?, stats = ? WHERE call_id = ?",
                (rows.ts, e.reason, e.stats, call),
            )
        for f in rows.finals:
            ex(
                cur,
                "INSERT INTO finals (event_id, call_id, role, aor, utterance_id, text, begin_ms, end_ms) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (rows.event_id, call, f.role, f.aor, f.utterance_id, f.text, f.begin_ms, f.end_ms),
            )
        for k in rows.kb_cards:
            ex(
                cur,
                "INSERT INTO kb_cards (event_id, call_id, entry_id, title, status, score, utterance_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (rows.event_id, call, k.entry_id, k.title, k.status, k.score, k.utterance_id),
            )
        for t in rows.tags:
            ex(
                cur,
                "INSERT INTO tags (event_id, call_id, kind, label, value, normalized) VALUES (?, ?, ?, ?, ?, ?)",
                (rows.event_id, call, t.kind, t.label, t.value, t.normalized),
            )
        if (w := rows.workorder) is not None:
            ex(
                cur,
                "INSERT INTO workorders (event_id, call_id, kind, revision, fields, confirmed_by) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (rows.event_id, call, w.kind, w.revision, w.fields, w.confirmed_by),
            )
        if rows.analytics is not None:
            ex(
                cur,
                "INSERT INTO analytics (call_id, event_id, body) VALUES (?, ?, ?) ON CONFLICT (call_id) "
                "DO UPDATE SET event_id = excluded.event_id, body = excluded.body",
                (call, rows.event_id, rows.analytics),
            )
        return True

    def delete_ended_before(
        self, before: str, routes: Sequence[str] | None = None, except_routes: Sequence[str] = ()
    ) -> int:
        """Delete the calls (of ``routes``, None: of every route but ``except_routes``) that ended,
        or never ended and started, before ``before`` (ISO-8601 UTC); how many calls."""
        where, params = ["COALESCE(ended_at, started_at) < ?"], [before]
        if routes is not None:
            if not routes:
                return 0
            where.append(f"route IN ({', '.join('?' * len(routes))})")
            params += list(routes)
        if except_routes:
            where.append(f"(route IS NULL OR route NOT IN ({', '.join('?' * len(except_routes))}))")
            params += list(except_routes)
        doomed = f"SELECT call_id FROM calls WHERE {' AND '.join(where)}"
        with self._lock, self._transaction() as cur:
            for table in ("finals", "kb_cards", "tags", "workorders", "analytics", "events"):
                self._execute(cur, f"DELETE FROM {table} WHERE call_id IN ({doomed})", params)
            return int(self._execute(cur, f"DELETE FROM calls WHERE call_id IN ({doomed})", params).rowcount)

    def log_access(self, user: str, action: str, what: Mapping[str, Any]) -> None:
        with self._lock, self._transaction() as cur:
            self._execute(
                cur,
                "INSERT INTO access_log (at, user_name, action, what) VALUES (?, ?, ?, ?)",
                (utc_timestamp(), user, action, json.dumps(dict(what), ensure_ascii=False)),
            )

    # -- reading -----------------------------------------------------------------------------

    def search(self, query: CallQuery) -> Page:
        where: list[str] = []
        params: list[Any] = []
        if query.tag:
            where.append(
                "EXISTS (SELECT 1 FROM tags t WHERE t.call_id = c.call_id "
                "AND (t.label = ? OR t.label LIKE ? ESCAPE '\\'))"
            )
            params += [query.tag, like_pattern(query.tag)[1:-1] + "/%"]
        if query.address:
            where.append(
                "EXISTS (SELECT 1 FROM tags t WHERE t.call_id = c.call_id AND t.label = 'address' "
                "AND (t.value LIKE ? ESCAPE '\\' OR t.normalized LIKE ? ESCAPE '\\'))"
            )
            params += [like_pattern(query.address)] * 2
        for column, value in (("agent", query.agent), ("route", query.route)):
            if value:
                where.append(f"c.{column} = ?")
                params.append(value)
        if query.started_from:
            where.append("c.started_at >= ?")
            params.append(query.started_from)
        if query.started_to:
            where.append("c.started_at < ?")
            params.append(query.started_to)
        if query.after is not None:
            where.append("(c.started_at < ? OR (c.started_at = ? AND c.call_id < ?))")
            params += [query.after[0], query.after[0], query.after[1]]
        limit = max(1, min(query.limit, MAX_PAGE_SIZE))
        head = (
            "SELECT c.call_id, c.route, c.agent, c.started_at, c.ended_at, c.end_reason, "
            "(SELECT f.text FROM finals f WHERE f.call_id = c.call_id "
            "ORDER BY CASE WHEN f.role = 'caller' THEN 0 ELSE 1 END, f.begin_ms, f.id LIMIT 1) "
        )
        newest_first = "ORDER BY c.started_at DESC, c.call_id DESC LIMIT ?"
        found: list[Any] = []
        with self._lock, self._transaction() as cur:
            if query.phrase and self._phrase_window:
                # A phrase many calls share is found among the newest few thousand calls by
                # reading their finals, faster than the index finds all of its calls; only when
                # fewer than a page turn up there does the index search below run.
                window = f"SELECT * FROM calls c {'WHERE ' + ' AND '.join(where) if where else ''} {newest_first}"
                statement = (
                    f"{head} FROM ({window}) c WHERE EXISTS (SELECT 1 FROM finals f WHERE f.call_id = c.call_id "
                    f"AND f.text LIKE ? ESCAPE '\\') {newest_first}"
                )
                args = [*params, self._phrase_window, like_pattern(query.phrase), limit + 1]
                found = self._execute(cur, statement, args).fetchall()
            if len(found) <= limit:
                if query.phrase:
                    clause, more = self._phrase_clause(query.phrase)
                    where, params = [clause, *where], [*more, *params]
                statement = f"{head} FROM calls c {'WHERE ' + ' AND '.join(where) if where else ''} {newest_first}"
                found = self._execute(cur, statement, [*params, limit + 1]).fetchall()
        hits = [CallHit(r[0], r[1], r[2], r[3], r[4], r[5], r[6] or "") for r in found[:limit]]
        has_more = len(found) > limit
        return Page(hits, (hits[-1].started_at, hits[-1].call_id) if has_more else None)

    def call(self, call_id: str) -> CallRecord | None:
        ex = self._execute
        with self._lock, self._transaction() as cur:
            head = ex(
                cur,
                "SELECT call_id, route, source, agent, started_at, ended_at, end_reason, participants, "
                "metadata, stats FROM calls WHERE call_id = ?",
                (call_id,),
            ).fetchone()
            if head is None:
                return None
            finals = ex(
                cur,
                "SELECT role, aor, utterance_id, text, begin_ms, end_ms, event_id FROM finals "
                "WHERE call_id = ? ORDER BY begin_ms, id",
                (call_id,),
            ).fetchall()
            cards = ex(
                cur,
                "SELECT entry_id, title, status, score, utterance_id, event_id FROM kb_cards "
                "WHERE call_id = ? ORDER BY id",
                (call_id,),
            ).fetchall()
            tags = ex(
                cur, "SELECT kind, label, value, normalized FROM tags WHERE call_id = ? ORDER BY id", (call_id,)
            ).fetchall()
            orders = ex(
                cur,
                "SELECT kind, revision, fields, confirmed_by, event_id FROM workorders WHERE call_id = ? ORDER BY id",
                (call_id,),
            ).fetchall()
            analytics = ex(cur, "SELECT body FROM analytics WHERE call_id = ?", (call_id,)).fetchone()
        return CallRecord(
            call_id=head[0],
            route=head[1],
            source=head[2],
            agent=head[3],
            started_at=head[4],
            ended_at=head[5],
            end_reason=head[6],
            participants=json.loads(head[7]),
            metadata=json.loads(head[8]),
            stats=json.loads(head[9]),
            finals=[
                dict(zip(("role", "aor", "utterance_id", "text", "begin_ms", "end_ms", "event_id"), r, strict=True))
                for r in finals
            ],
            kb_cards=[
                dict(zip(("entry_id", "title", "status", "score", "utterance_id", "event_id"), r, strict=True))
                for r in cards
            ],
            tags=[dict(zip(("kind", "label", "value", "normalized"), r, strict=True)) for r in tags],
            workorders=[
                {"kind": r[0], "revision": r[1], "fields": json.loads(r[2]), "confirmed_by": r[3], "event_id": r[4]}
                for r in orders
            ],
            analytics=json.loads(analytics[0]) if analytics else None,
        )

    def access_log(self, limit: int = 100) -> list[AccessEntry]:
        with self._lock, self._transaction() as cur:
            rows = self._execute(
                cur, "SELECT at, user_name, action, what FROM access_log ORDER BY id DESC LIMIT ?", (limit,)
            ).fetchall()
        return [AccessEntry(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

    def call_ids(self) -> Iterator[str]:
        """Every archived call id (tests and the benchmark's checks)."""
        with self._lock, self._transaction() as cur:
            rows = self._execute(cur, "SELECT call_id FROM calls ORDER BY call_id").fetchall()
        return iter(r[0] for r in rows)

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        """Every row of one of the archive's tables (audits and tests: what the database holds)."""
        self._known(table)
        with self._lock, self._transaction() as cur:
            return [tuple(r) for r in self._execute(cur, f"SELECT * FROM {table}").fetchall()]

    @staticmethod
    def _known(table: str) -> None:
        if table not in TABLES:
            raise ValueError(f"no archive table {table!r}; the tables are {', '.join(TABLES)}")

    def count(self, table: str) -> int:
        """Rows in one of the archive's tables (tests and the benchmark)."""
        self._known(table)
        with self._lock, self._transaction() as cur:
            return int(self._execute(cur, f"SELECT COUNT(*) FROM {table}").fetchone()[0])
