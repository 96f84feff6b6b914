"""The archive's databases for tests: ``store_url`` gives each test an empty SQLite file or an
empty database on a real PostgreSQL server (``archive.local_postgres``, one per test module).
Import both fixtures into a test module: ``from tests.archive_db import postgres, store_url``."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from archive.local_postgres import LocalPostgres

_numbers = itertools.count()


@pytest.fixture(scope="module")
def postgres() -> Iterator[LocalPostgres]:
    with LocalPostgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path / 'archive.db'}"
        return
    server: LocalPostgres = request.getfixturevalue("postgres")
    import psycopg

    with psycopg.connect(server.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        name = f"archive_test_{next(_numbers)}"
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    yield server.url.rsplit("/", 1)[0] + "/" + name
