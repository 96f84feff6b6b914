"""``SipSettings``: every knob of the SIP side, with defaults that work on one host.

The service config embeds this model; each field is documented here once.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Transport = Literal["udp", "tcp", "tls"]
_DEFAULT_TRANSPORTS: tuple[Transport, ...] = ("udp", "tcp")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOCAL_NETWORKS: tuple[Network, ...] = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        "127.0.0.0/8",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
    )
)
"""What an empty ``acl_cidrs`` admits: loopback, RFC 1918, link-local and IPv6 unique-local."""


def is_local_network(network: Network) -> bool:
    """Whether every address of ``network`` is loopback or private (inside ``LOCAL_NETWORKS``)."""
    return any(
        network.version == local.version and network.subnet_of(local)  # type: ignore[arg-type]
        for local in LOCAL_NETWORKS
    )


def _is_local_host(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable only from loopback/private addresses."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"
    return not address.is_unspecified and is_local_network(ipaddress.ip_network(address))


class AuthSettings(BaseModel):
    """Digest authentication (RFC 2617/7616, MD5) of INVITEs; ``users`` maps user name to password."""

    model_config = ConfigDict(extra="forbid")
    realm: str = "hotline-asr"
    users: dict[str, str] = Field(default_factory=dict)


class SipSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = Field("0.0.0.0", description="address the SIP listeners bind to")
    port: int = Field(5060, ge=0, le=65535, description="SIP port (UDP and TCP); 0 picks a free one")
    tls_port: int = Field(5061, ge=0, le=65535, description="SIP over TLS port")
    transports: list[Transport] = Field(default_factory=lambda: list(_DEFAULT_TRANSPORTS))
    tls_cert: str | None = Field(None, description="PEM certificate file; needed for the tls transport")
    tls_key: str | None = Field(None, description="PEM private key file; needed for the tls transport")
    tls_ca: str | None = Field(
        None,
        description="PEM CA file that the certificates of peers we connect to over TLS must chain to "
        "(a BYE after the peer closed its connection); the system's CAs when unset",
    )
    tls_verify_peer: bool = Field(
        True, description="check the certificate (chain and host name or IP) of peers we connect to over TLS"
    )
    connect_timeout_s: float = Field(
        5.0, gt=0, description="how long opening a TCP/TLS connection for a request we send may take"
    )
    advertised_host: str | None = Field(
        None, description="address put in Contact/Via/SDP; defaults to host, or 127.0.0.1 when host is 0.0.0.0"
    )
    acl_cidrs: list[Network] = Field(
        default_factory=list,
        description="allowed sources; empty: loopback and private ranges only (LOCAL_NETWORKS); "
        "[0.0.0.0/0, ::/0] admits any source",
    )
    acl_action: Literal["reject", "drop"] = Field("reject", description="reject: 403; drop: no answer")
    max_calls: int = Field(
        1000,
        ge=1,
        description="the node's limit on calls held at once, of every front door (SIP, AudioSocket, WebSocket; "
        "at most engine.max_streams); a new call past it is refused (SIP: 503 + Retry-After)",
    )
    max_message_bytes: int = Field(65536, ge=1024, description="larger messages are refused (513) or dropped")
    invite_rate_per_s: float = Field(50.0, gt=0, description="new INVITEs per second per source IP")
    invite_burst: int = Field(100, ge=1, description="token-bucket depth of the INVITE rate limit")
    trusted_cidrs: list[Network] = Field(
        default_factory=list,
        description="trusted proxies/SBCs; with the routes file's trunks they get trusted_budget_factor times "
        "the per-source budgets and are exempt from the global transaction and connection caps",
    )
    trusted_budget_factor: int = Field(10, ge=1, description="budget multiplier of trusted sources and trunks")
    trusted_proxies: list[Network] = Field(
        default_factory=list,
        description="SIP proxies in front of this node (Kamailio's dispatcher): they are admitted themselves, "
        "and the caller address they state in source_header replaces theirs for routing (trunk, source_cidrs), "
        "the ACL and the INVITE rate; the header from any other source is ignored",
    )
    source_header: str = Field(
        "X-Source-Addr",
        pattern=r"^[A-Za-z0-9-]{1,64}$",
        description="header in which a trusted proxy states the caller's address (IP, IP:port or [IPv6]:port)",
    )
    source_rate_per_s: float = Field(
        200.0, gt=0, description="requests per second per source IP, all methods; more are dropped"
    )
    source_burst: int = Field(400, ge=1, description="token-bucket depth of the per-source request rate")
    source_max_transactions: int = Field(
        512,
        ge=1,
        description="open server transactions per source IP (a UDP one lingers 32 s after its answer); "
        "more get 503 + Retry-After",
    )
    source_max_connections: int = Field(32, ge=1, description="open TCP/TLS connections per source IP; more are closed")
    stream_idle_timeout_s: float = Field(32.0, gt=0, description="close a TCP/TLS connection silent this long")
    stream_message_timeout_s: float = Field(
        5.0, gt=0, description="close a TCP/TLS connection whose message is incomplete this long after its first byte"
    )
    max_header_bytes: int = Field(16384, ge=1024, description="larger header blocks close the TCP/TLS connection")
    auth: AuthSettings | None = Field(None, description="digest auth for INVITEs; none when unset")
    session_expires_s: int = Field(1800, ge=90, description="session interval we ask for (RFC 4028)")
    min_se_s: int = Field(90, ge=90, description="smallest session interval we accept; less gets 422")
    retry_after_s: int = Field(5, ge=1, description="Retry-After of 503 answers")
    drain_wait_s: float = Field(
        0.0,
        ge=0,
        description="on SIGTERM, keep running this long at most (OPTIONS and new INVITEs answered 503, so a "
        "dispatcher probing every few seconds sees the node leave) while the calls end on their own; the calls "
        "still up then get BYE. 0: BYE them at once",
    )
    drain_linger_s: float = Field(
        0.0,
        ge=0,
        description="on SIGTERM, keep answering OPTIONS 503 at least this long (at most drain_wait_s), also with "
        "no call left, so a dispatcher's next probe gets a 503 rather than no answer; set it to the probe interval",
    )
    answer_delay_ms: int = Field(0, ge=0, description="ring this long (180) before answering; tests use it")
    user_agent: str = "hotline-asr"
    t1_ms: int = Field(500, ge=10, description="RFC 3261 T1 (RTT estimate)")
    t2_ms: int = Field(4000, ge=100, description="RFC 3261 T2 (max retransmit interval)")
    rtp_inactivity_timeout_s: float = Field(30.0, gt=0, description="hang up a leg after this much RTP silence")
    rtp_reorder_ms: int = Field(60, ge=0, description="RTP reorder window")

    @model_validator(mode="after")
    def _tls_files(self) -> SipSettings:
        if "tls" in self.transports and not (self.tls_cert and self.tls_key):
            raise ValueError("the tls transport needs tls_cert and tls_key (PEM files)")
        return self

    def effective_acl(self) -> tuple[Network, ...]:
        """The sources admitted: ``acl_cidrs``, or ``LOCAL_NETWORKS`` when it is empty."""
        return tuple(self.acl_cidrs) or LOCAL_NETWORKS

    def acl_summary(self) -> str:
        """The start-up line that says who may send."""
        if not self.acl_cidrs:
            return (
                "sip.acl_cidrs is empty: admitting loopback and private sources only ("
                + ", ".join(map(str, LOCAL_NETWORKS))
                + "); list the PBX/SBC addresses, or [0.0.0.0/0, ::/0] for any"
            )
        return "sip.acl_cidrs admits " + ", ".join(map(str, self.acl_cidrs))

    def open_settings(self) -> list[str]:
        """Warnings naming each setting that lets the public Internet reach the SIP side."""
        public = [str(net) for net in self.effective_acl() if not is_local_network(net)]
        if not public:
            return []
        warnings = [f"sip.acl_cidrs admits public sources ({', '.join(public)})"]
        if self.auth is None and not _is_local_host(self.host):
            warnings.append(f"no digest auth (sip.auth) while sip.host {self.host} accepts public sources")
        return warnings

    def public_host(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
