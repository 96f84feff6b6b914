"""Redis clients from a URL: plain, TLS (rediss://), unix socket, Sentinel and Cluster.

Sentinel URLs: ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]``
(``rediss+sentinel://`` for TLS to the master). The password in the URL authenticates to the
master; ``?sentinel_password=...`` authenticates to the sentinels.

Cluster URLs: ``redis+cluster://[[user]:password@]host:port[,host:port...]`` (``rediss+cluster://``
for TLS; ``?ssl_ca_certs=`` / ``?ssl_cert_reqs=`` as for ``rediss://``). Any reachable node is
enough to discover the others; a cluster has only database 0, so no path is allowed.

``RETRYABLE``: the errors after which the publisher connects again and sends the batch again
(a lost or restarted server, a failover in progress).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
PLAIN_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_TLS_OPTIONS = frozenset({"ssl_ca_certs", "ssl_cert_reqs"})
CLUSTER_OPTIONS = SENTINEL_TLS_OPTIONS
RETRYABLE: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,  # a replica after a Sentinel failover: reconnect to the new master
    NoScriptError,  # Redis restarted between SCRIPT LOAD and EVALSHA
    ClusterDownError,  # Cluster: a master failed, its replica not yet promoted
    TryAgainError,
    SlotNotCoveredError,
    MovedError,  # Cluster: redirects kept changing (slots moving); ask again later
    OSError,
    asyncio.TimeoutError,
)


def refused_without_replicas(exc: BaseException) -> bool:
    """``NOREPLICAS``: a master with ``min-replicas-to-write`` that has lost its replicas (or a
    master cut off from them in a failover) refuses writes; retry like a lost connection."""
    return isinstance(exc, ResponseError) and "NOREPLICAS" in str(exc)


def shown(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hosts = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{hosts}"


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


@dataclass(frozen=True)
class ClusterTarget:
    hosts: list[tuple[str, int]]
    username: str | None = None
    password: str | None = None
    tls: bool = False
    options: dict[str, str] = field(default_factory=dict)


def _userinfo_and_hosts(
    netloc: str, url: str, what: str, default_port: int
) -> tuple[str | None, str | None, list[tuple[str, int]]]:
    """``[user[:password]@]host:port[,host:port...]`` -> (username, password, hosts)."""
    userinfo, _, hostlist = netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, _, pw = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(pw) or None)
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, str(default_port)
        try:
            if not host or not 0 < int(port) < 65536:
                raise ValueError
            hosts.append((host.strip("[]"), int(port)))
        except ValueError:
            raise ValueError(f"bad {what} address {item!r} in {shown(url)!r}; expected host:port") from None
    return username, password, hosts


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Split a Sentinel URL; raise ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise ValueError(f"not a Sentinel URL (scheme must be {' or '.join(SENTINEL_SCHEMES)}): {shown(url)!r}")
    username, password, hosts = _userinfo_and_hosts(parts.netloc, url, "sentinel", 26379)
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError(
            f"Sentinel URL {shown(url)!r} needs the master's service name: redis+sentinel://host:26379/mymaster/0"
        )
    try:
        db = int(path[1]) if len(path) > 1 else 0
    except ValueError:
        raise ValueError(f"bad database number {path[1]!r} in {shown(url)!r}") from None
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    sentinel_password = query.pop("sentinel_password", None)
    unknown = sorted(set(query) - SENTINEL_TLS_OPTIONS)
    if unknown:
        allowed = ", ".join(sorted(SENTINEL_TLS_OPTIONS | {"sentinel_password"}))
        raise ValueError(f"unknown option(s) {', '.join(unknown)} in {shown(url)!r}; allowed: {allowed}")
    tls = parts.scheme.startswith("rediss")
    return SentinelTarget(hosts, path[0], db, username, password, sentinel_password, tls, query)


def parse_cluster_url(url: str) -> ClusterTarget:
    """Split a Cluster URL; raise ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"not a Cluster URL (scheme must be {' or '.join(CLUSTER_SCHEMES)}): {shown(url)!r}")
    username, password, hosts = _userinfo_and_hosts(parts.netloc, url, "cluster node", 6379)
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"Redis Cluster has only database 0; drop the path {parts.path!r} from {shown(url)!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = sorted(set(query) - CLUSTER_OPTIONS)
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} in {shown(url)!r}; allowed: {', '.join(sorted(CLUSTER_OPTIONS))}"
        )
    return ClusterTarget(hosts, username, password, parts.scheme.startswith("rediss"), query)


def url_kind(url: str) -> str:
    """``plain``, ``sentinel`` or ``cluster``; ValueError for an unknown scheme."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in SENTINEL_SCHEMES:
        return "sentinel"
    if scheme in CLUSTER_SCHEMES:
        return "cluster"
    if scheme in PLAIN_SCHEMES:
        return "plain"
    known = ", ".join(f"{s}://" for s in (*PLAIN_SCHEMES, *SENTINEL_SCHEMES, *CLUSTER_SCHEMES))
    raise ValueError(f"unsupported Redis URL {shown(url)!r}: the scheme must be one of {known}")


def validate_url(url: str) -> str:
    """Check ``url`` the way ``make_client`` will read it; ValueError names the problem."""
    kind = url_kind(url)
    if kind == "sentinel":
        parse_sentinel_url(url)
    elif kind == "cluster":
        parse_cluster_url(url)
    return url


def make_client(url: str, connect_timeout_s: float, op_timeout_s: float) -> aioredis.Redis:
    """A client that never retries on its own: the publisher owns retries, backoff and spooling.

    For a Cluster URL this is a ``RedisCluster`` (same command methods; it follows MOVED/ASK
    and re-reads the slot map itself)."""
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
    if url.split("://", 1)[0] in CLUSTER_SCHEMES:
        cluster = parse_cluster_url(url)
        tls: dict[str, Any] = dict(cluster.options)
        client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in cluster.hosts],
            username=cluster.username,
            password=cluster.password,
            ssl=cluster.tls,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=op_timeout_s,
            retry=Retry(NoBackoff(), 1),  # one more try after re-reading the slot map; then the publisher's backoff
            **tls,
        )
        return client  # type: ignore[return-value]  # the same command interface as Redis
    return aioredis.from_url(url, **common)
