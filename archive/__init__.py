"""The call archive: every call's events kept in a database (SQLite or PostgreSQL), searchable.

``archive.store``: the ``ArchiveStore`` interface, its query and record types, ``open_store(url)``.
``archive.rows``: an event (its JSON form) as the rows it adds (sans-IO).
``archive.sql``: the one SQL implementation, over two dialects (``sqlite_store``, ``postgres_store``).
``archive.archiver``: the firehose consumer (``asr-archive run``). docs/archive.md.
"""
