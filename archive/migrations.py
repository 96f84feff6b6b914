"""The archive's schema, as ordered migration steps per dialect.

``schema_version`` holds one row, the number of the last step applied. A store applies the
steps after it, each in its own transaction with the version bump, so a crash mid-migration
leaves the previous version whole. Add a step at the end; never edit one that has shipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Dialect = Literal["sqlite", "postgresql"]

_TYPES = {
    "sqlite": {"id": "INTEGER PRIMARY KEY", "float": "REAL"},
    "postgresql": {"id": "BIGSERIAL PRIMARY KEY", "float": "DOUBLE PRECISION"},
}

_TABLES = """
CREATE TABLE calls (
    call_id TEXT PRIMARY KEY, route TEXT, source TEXT, source_call_id TEXT, agent TEXT,
    started_at TEXT NOT NULL, ended_at TEXT, end_reason TEXT,
    participants TEXT NOT NULL DEFAULT '[]', metadata TEXT NOT NULL DEFAULT '{{}}', stats TEXT NOT NULL DEFAULT '{{}}'
);
CREATE INDEX calls_started ON calls (started_at, call_id);
CREATE INDEX calls_agent ON calls (agent, started_at);
CREATE INDEX calls_route ON calls (route, started_at);
CREATE INDEX calls_ended ON calls (ended_at);
CREATE TABLE events (event_id TEXT PRIMARY KEY, call_id TEXT NOT NULL, event_type TEXT NOT NULL);
CREATE INDEX events_call ON events (call_id);
CREATE TABLE finals (
    id {id}, event_id TEXT NOT NULL UNIQUE, call_id TEXT NOT NULL, role TEXT, aor TEXT, utterance_id INTEGER,
    text TEXT NOT NULL, begin_ms INTEGER, end_ms INTEGER
);
CREATE INDEX finals_call ON finals (call_id, begin_ms);
CREATE TABLE kb_cards (
    id {id}, event_id TEXT NOT NULL UNIQUE, call_id TEXT NOT NULL, entry_id TEXT NOT NULL, title TEXT,
    status TEXT, score {float}, utterance_id INTEGER
);
CREATE INDEX kb_cards_call ON kb_cards (call_id);
CREATE TABLE tags (
    id {id}, event_id TEXT NOT NULL, call_id TEXT NOT NULL, kind TEXT NOT NULL, label TEXT NOT NULL,
    value TEXT, normalized TEXT
);
CREATE INDEX tags_call ON tags (call_id);
CREATE INDEX tags_label ON tags (label, call_id);
CREATE TABLE workorders (
    id {id}, event_id TEXT NOT NULL UNIQUE, call_id TEXT NOT NULL, kind TEXT NOT NULL, revision INTEGER NOT NULL,
    fields TEXT NOT NULL, confirmed_by TEXT
);
CREATE INDEX workorders_call ON workorders (call_id, revision);
CREATE TABLE analytics (call_id TEXT PRIMARY KEY, event_id TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE access_log (id {id}, at TEXT NOT NULL, user_name TEXT NOT NULL, action TEXT NOT NULL, what TEXT NOT NULL);
CREATE INDEX access_log_at ON access_log (at)
"""

# Phrase search: SQLite's FTS5 with the trigram tokenizer (SQLite >= 3.34) indexes every run of
# three characters, so a Chinese phrase is found without word segmentation; PostgreSQL's
# pg_trgm GIN index does the same for LIKE '%phrase%'.
_PHRASE_INDEX = {
    "sqlite": """
CREATE VIRTUAL TABLE finals_fts USING fts5(text, content='finals', content_rowid='id', tokenize='trigram');
CREATE TRIGGER finals_fts_insert AFTER INSERT ON finals BEGIN
    INSERT INTO finals_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER finals_fts_delete AFTER DELETE ON finals BEGIN
    INSERT INTO finals_fts (finals_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
INSERT INTO finals_fts (finals_fts) VALUES ('rebuild')
""",
    "postgresql": """
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX finals_text_trgm ON finals USING gin (text gin_trgm_ops);
CREATE INDEX tags_value_trgm ON tags USING gin (value gin_trgm_ops)
""",
}


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    what: str
    statements: dict[str, list[str]]  # dialect -> statements, in order


def _split(sql: str) -> list[str]:
    """Statements separated by ``;`` at a line's end (trigger bodies keep their inner ``;``)."""
    out, current = [], []
    for line in sql.strip().splitlines():
        current.append(line)
        if line.rstrip().endswith(";") and not line.startswith("    "):
            out.append("\n".join(current).rstrip().rstrip(";"))
            current = []
    if current:
        out.append("\n".join(current))
    return [s for s in out if s.strip()]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "calls, finals, KB cards, tags, work orders, analytics, access log",
        {d: _split(_TABLES.format(**_TYPES[d])) for d in ("sqlite", "postgresql")},
    ),
    Migration(2, "phrase search index", {d: _split(_PHRASE_INDEX[d]) for d in ("sqlite", "postgresql")}),
)
LATEST = MIGRATIONS[-1].version
