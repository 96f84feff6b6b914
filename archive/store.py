"""What the archive offers its readers and its writer, whatever the database.

An archived call is found by ``CallQuery`` (every given criterion must hold) and paged by keyset:
results come newest first by (``started_at``, ``call_id``), and the next page starts after the
last hit of this one (``Page.next_after``), so a page costs the same however deep it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


class ArchiveError(RuntimeError):
    """The archive database cannot be opened or used; the message says which and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallQuery:
    """A search; ``None`` means any. Times are ISO-8601 UTC text as events carry them (``ts``)."""

    phrase: str | None = None  # a run of characters in any party's finals (Chinese works: no words needed)
    tag: str | None = None  # a tag or category label, or its top level (``市政设施`` finds ``市政设施/井盖``)
    address: str | None = None  # a part of an address the call's tags or work order named
    agent: str | None = None  # the agent id (call.started metadata under the agent id key)
    route: str | None = None
    started_from: str | None = None  # started at or after
    started_to: str | None = None  # started before
    after: tuple[str, str] | None = None  # keyset: (started_at, call_id) of the previous page's last hit
    limit: int = DEFAULT_PAGE_SIZE


@dataclass(frozen=True, slots=True)
class CallHit:
    call_id: str
    route: str | None
    agent: str | None
    started_at: str
    ended_at: str | None
    end_reason: str | None
    first_words: str  # the caller's (or anyone's) first final, for the results list


@dataclass(frozen=True, slots=True)
class Page:
    hits: list[CallHit]
    next_after: tuple[str, str] | None  # pass as ``CallQuery.after`` for the next page; None: last page


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One archived call, whole: what its page shows."""

    call_id: str
    route: str | None
    source: str | None
    agent: str | None
    started_at: str
    ended_at: str | None
    end_reason: str | None
    participants: list[dict[str, Any]]
    metadata: dict[str, str]
    stats: dict[str, Any]
    finals: list[dict[str, Any]] = field(default_factory=list)  # {role, utterance_id, text, begin_ms, end_ms, event_id}
    kb_cards: list[dict[str, Any]] = field(default_factory=list)  # {entry_id, title, status, score, event_id}
    tags: list[dict[str, Any]] = field(default_factory=list)  # {kind, label, value, normalized}
    workorders: list[dict[str, Any]] = field(default_factory=list)  # {kind: draft|confirmed, revision, fields, ...}
    analytics: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AccessEntry:
    at: str
    user: str
    action: str  # "search" or "view"
    what: dict[str, Any]


class ArchiveStore(Protocol):
    """The archive database. ``apply`` is idempotent by ``event_id``: an event applied twice (an
    at-least-once redelivery) changes nothing the second time."""

    def apply(self, events: Sequence[Mapping[str, Any]]) -> int:
        """Write ``events`` (their JSON form) in one transaction; the number not seen before."""
        ...

    def search(self, query: CallQuery) -> Page: ...

    def call(self, call_id: str) -> CallRecord | None: ...

    def delete_ended_before(
        self, before: str, routes: Sequence[str] | None = None, except_routes: Sequence[str] = ()
    ) -> int:
        """Delete the calls of ``routes`` (None: every route but ``except_routes``) that ended
        (or, never ended, started) before ``before``; how many."""
        ...

    def log_access(self, user: str, action: str, what: Mapping[str, Any]) -> None: ...

    def access_log(self, limit: int = 100) -> list[AccessEntry]: ...

    def schema_version(self) -> int: ...

    def close(self) -> None: ...


def open_store(url: str) -> ArchiveStore:
    """``sqlite:///path/archive.db`` (``sqlite:///:memory:`` for a throwaway one) or
    ``postgresql://user@host:port/db``; the schema is migrated to the newest version."""
    if url.startswith("sqlite://"):
        from archive.sqlite_store import SqliteStore

        path = url.removeprefix("sqlite://")
        if not path.startswith("/"):
            raise ArchiveError(f"{url}: write sqlite:///path/to/archive.db (the path after the third slash, absolute)")
        return SqliteStore(":memory:" if path == "/:memory:" else path)
    if url.startswith(("postgresql://", "postgres://")):
        from archive.postgres_store import PostgresStore

        return PostgresStore(url)
    raise ArchiveError(f"{url}: an archive URL is sqlite:///path or postgresql://user@host:port/db")
