"""``asr-archive run``: the archiver as a process (docs/archive.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from archive.archiver import DEFAULT_GROUP, Archiver, Retention
from archive.rows import DEFAULT_AGENT_ID_KEY
from archive.sql import SqlStore
from archive.store import ArchiveError, open_store
from kb_hooks.config import RedisSettings
from kb_hooks.connection import make_client, url_kind
from kb_hooks.keys import KeyLayout


def _route_days(text: str) -> tuple[str, int]:
    route, sep, days = text.partition("=")
    if not sep or not route or not days.isdigit() or int(days) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: write ROUTE=DAYS, e.g. hotline=180")
    return route, int(days)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-archive", description="Keep every call in a database, searchable.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="archive the firehose until stopped (SIGTERM/SIGINT)")
    run.add_argument("--redis", default=os.environ.get("ASR_REDIS_URL", "redis://127.0.0.1:6379/0"))
    run.add_argument(
        "--db",
        default=os.environ.get("ASR_ARCHIVE_DB"),
        required="ASR_ARCHIVE_DB" not in os.environ,
        help="sqlite:///path/archive.db or postgresql://user@host:port/db (or $ASR_ARCHIVE_DB)",
    )
    run.add_argument("--prefix", default="asr", help="the service's redis.key_prefix (default %(default)s)")
    shards = RedisSettings.model_fields["firehose_shards"].default
    run.add_argument("--shards", type=int, default=shards, help="firehose shards on a Cluster (default %(default)s)")
    run.add_argument("--group", default=DEFAULT_GROUP, help="consumer group (default %(default)s)")
    run.add_argument("--consumer", default=socket.gethostname(), help="consumer name (default: the host name)")
    run.add_argument("--agent-id-key", default=DEFAULT_AGENT_ID_KEY, help="call.started metadata key of the agent")
    run.add_argument(
        "--retention",
        type=_route_days,
        action="append",
        default=[],
        metavar="ROUTE=DAYS",
        help="keep ROUTE's calls DAYS days after they end (repeatable)",
    )
    run.add_argument("--default-retention-days", type=int, metavar="DAYS", help="for routes not named (default: keep)")
    run.add_argument("--batch", type=int, default=500, help="entries per read and per transaction")
    run.add_argument("--sweep-every-s", type=float, default=3600.0, help="how often retention runs")
    return parser


async def _run(args: argparse.Namespace) -> int:
    store = open_store(args.db)
    assert isinstance(store, SqlStore)
    store.agent_id_key = args.agent_id_key
    client = make_client(args.redis, 2.0, 10.0)
    layout = KeyLayout(args.shards if url_kind(args.redis) == "cluster" else 0)
    retention = Retention(dict(args.retention), args.default_retention_days)
    archiver = Archiver(
        client,
        store,
        args.prefix,
        layout,
        args.group,
        args.consumer,
        batch=args.batch,
        retention=retention,
        sweep_every_s=args.sweep_every_s,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, archiver.stop)
    try:
        await archiver.run()
    finally:
        await client.aclose()
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except ArchiveError as exc:
        print(f"asr-archive: {exc}", file=sys.stderr)
        return 2
