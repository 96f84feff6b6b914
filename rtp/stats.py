"""Per-leg receive counters, shared by the reorder buffer (sans-IO) and the leg (transport)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class LegStats:
    """Counters of one RTP leg. Packet counts are RTP packets unless named otherwise.

    `lost` counts sequence numbers declared missing (a late arrival afterwards also counts as
    `late`); `jitter_ms` is the RFC 3550 section 6.4.1 interarrival jitter estimate;
    `foreign_*` count datagrams dropped unread because of their source (`rtp.latch`);
    `srtp_*` count packets of an SRTP leg dropped before parsing (`rtp.srtp`);
    `samples_out` counts 16 kHz samples handed to the sink; times are `time.monotonic()`.
    """

    packets: int = 0
    bytes: int = 0
    lost: int = 0
    late: int = 0
    duplicate: int = 0
    reordered: int = 0
    jitter_ms: float = 0.0
    ssrc_changes: int = 0
    bad_packets: int = 0
    samples_out: int = 0
    first_packet_time: float | None = None
    last_packet_time: float | None = None
    foreign_packets: int = 0  # RTP and RTCP datagrams dropped by the source policy (`rtp.latch`)
    foreign_address: int = 0  # of them RTP from an IP the SDP did not signal
    foreign_port: int = 0  # of them RTP from the signalled IP but a port the policy refused
    sequence_resets: int = 0
    comfort_noise_packets: int = 0
    telephone_event_packets: int = 0
    dtmf_events: int = 0  # RFC 4733 key presses read from the telephone-event packets (`rtp.dtmf`)
    unknown_payload_packets: int = 0
    concealed_samples: int = 0
    rtcp_packets: int = 0
    srtp_auth_failed: int = 0  # SRTP/SRTCP packets dropped: authentication failed (wrong key, tampering)
    srtp_replayed: int = 0  # SRTP/SRTCP packets dropped by the replay check (repeated or too old)
    srtp_bad: int = 0  # SRTP/SRTCP packets refused otherwise (too short, before the keys were known ...)

    def as_dict(self) -> dict[str, int | float | None]:
        return asdict(self)
