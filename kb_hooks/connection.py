"""Redis clients from a URL: plain, TLS (rediss://), unix socket and Sentinel.

Sentinel URLs: ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]``
(``rediss+sentinel://`` for TLS to the master). The password in the URL authenticates to the
master; ``?sentinel_password=...`` authenticates to the sentinels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_TLS_OPTIONS = frozenset({"ssl_ca_certs", "ssl_cert_reqs"})


@dataclass(frozen=True)
class SentinelTarget:
    hosts: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    tls: bool = False
    options: dict[str, str] = field(default_factory=dict)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Split a Sentinel URL; raise ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise ValueError(f"not a Sentinel URL (scheme must be {' or '.join(SENTINEL_SCHEMES)}): {url!r}")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, _, pw = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(pw) or None)
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, "26379"
        try:
            hosts.append((host.strip("[]"), int(port)))
        except ValueError:
            raise ValueError(f"bad sentinel address {item!r} in {url!r}; expected host:port") from None
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError(
            f"Sentinel URL {url!r} needs the master's service name: redis+sentinel://host:26379/mymaster/0"
        )
    try:
        db = int(path[1]) if len(path) > 1 else 0
    except ValueError:
        raise ValueError(f"bad database number {path[1]!r} in {url!r}") from None
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    sentinel_password = query.pop("sentinel_password", None)
    unknown = sorted(set(query) - SENTINEL_TLS_OPTIONS)
    if unknown:
        allowed = ", ".join(sorted(SENTINEL_TLS_OPTIONS | {"sentinel_password"}))
        raise ValueError(f"unknown option(s) {', '.join(unknown)} in {url!r}; allowed: {allowed}")
    tls = parts.scheme.startswith("rediss")
    return SentinelTarget(hosts, path[0], db, username, password, sentinel_password, tls, query)


def make_client(url: str, connect_timeout_s: float, op_timeout_s: float) -> aioredis.Redis:
    """A client that never retries on its own: the publisher owns retries, backoff and spooling."""
    common: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": op_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 30,
    }
    if url.split("://", 1)[0] in SENTINEL_SCHEMES:
        target = parse_sentinel_url(url)
        sentinel_kwargs: dict[str, Any] = {
            "socket_connect_timeout": connect_timeout_s,
            "socket_timeout": op_timeout_s,
        }
        if target.sentinel_password:
            sentinel_kwargs["password"] = target.sentinel_password
        sentinel = Sentinel(target.hosts, sentinel_kwargs=sentinel_kwargs, **common)
        tls_options: dict[str, Any] = dict(target.options)
        master: aioredis.Redis = sentinel.master_for(
            target.service,
            db=target.db,
            username=target.username,
            password=target.password,
            ssl=target.tls,
            **tls_options,
        )
        return master
    return aioredis.from_url(url, **common)
