"""Arming the C receive path (`rtp._fastrtp`, run by `rtp.poller.DatagramPoller`) for one leg.

A leg whose last packet took the in-order path *arms* the C receiver with what it expects
next (sequence number, timestamp, payload size, SSRC, payload type, source address) and its
RFC 3550 jitter state. The receiver then takes the packets that match, counts them and
collects their payloads into the leg's batches. Any other datagram reaches the leg's Python
handler, which first *takes* the C state back (`FastPath.take`): counters, jitter, how far
the stream advanced, the payload bytes of an unfinished batch. Only the handover lives
here; the leg applies what comes back to its own reorder buffer and counters.

The receiver also applies the leg's source policy (`rtp.latch`) to every datagram, armed or
not: one from an address the policy refuses is counted and dropped in C, without a Python
object and without disarming the leg (`FastPath.screen`).

For an SRTP leg the receiver also gets the leg's libsrtp session (`FastPath.set_srtp`) and
unprotects the in-order packets in place before taking them; a packet that fails goes to the
leg's Python handler, which counts it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from rtp.srtp import SrtpReceiver

Address = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class FastTake:
    """What the C receiver took for a leg since the last take."""

    packets: int  # packets taken (and counted nowhere else yet)
    size: int  # their bytes, headers included
    arrival: float  # time.monotonic() of the last one, s
    jitter_ticks: float  # RFC 3550 interarrival jitter, 8 kHz clock ticks
    jitter_arrival: float  # arrival of the packet the jitter was last updated with, s
    jitter_timestamp: int  # its RTP timestamp
    since_arm: int  # in-order packets since arming (for the reorder buffer), with `disarm` only
    next_timestamp: int  # the RTP timestamp expected next
    last_payload: bytes  # payload of the last in-order packet
    pending: bytes  # payloads of a batch not yet handed over, with `disarm` only
    payload_type: int  # the payload type the leg was armed with
    foreign_address: int  # datagrams dropped as from an IP not signalled
    foreign_port: int  # datagrams dropped as from the signalled IP's refused port


class FastPath:
    """One leg's handle on the poller's C receiver: attached once the leg's RTP socket is
    registered there; `armed` while it takes the leg's in-order packets."""

    def __init__(self) -> None:
        self._receiver: Any = None
        self._fd = -1
        self.armed = False
        self._payload_type = -1

    @property
    def available(self) -> bool:
        """Whether the leg's RTP socket is read by the C receiver (so arming is possible)."""
        return self._receiver is not None

    def attach(self, receiver: Any, fd: int) -> None:
        """Use `receiver` (the poller's `rtp._fastrtp.Receiver`) for the RTP socket `fd`."""
        self._receiver, self._fd = receiver, fd

    def set_srtp(self, receiver: SrtpReceiver | None) -> bool:
        """Let the C receiver unprotect the leg's in-order SRTP packets with `receiver`'s session
        (None: plain RTP); disarms. Whether the leg may arm the C path from now on: False for
        SRTP the C receiver cannot unprotect (an older build, an MKI)."""
        self.armed = False
        set_srtp = getattr(self._receiver, "set_srtp", None)
        native = receiver.native() if receiver is not None else None
        if set_srtp is not None:
            if native is None:
                set_srtp(self._fd, None, 0, 0, 0)
            else:
                set_srtp(self._fd, *native)
        return receiver is None or (set_srtp is not None and native is not None)

    def detach(self) -> None:
        """The socket left the receiver (the leg closed): nothing more to arm or take."""
        self._receiver, self._fd, self.armed = None, -1, False

    def screen(self, allowed: tuple[str, int] | None) -> None:
        """Drop datagrams in C unless from `allowed` (IP, port; port 0 for any), counting them;
        None lets all through to the leg. A host that is not an IP address lets all through."""
        if self._receiver is None:
            return
        packed: bytes | None = None
        port = 0
        if allowed is not None:
            host, port = allowed
            try:
                packed = socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
            except OSError:
                packed = None
        self._receiver.screen(self._fd, packed, port)

    def arm(
        self,
        expectation: tuple[int, int, int, int],
        payload_type: int,
        addr: Address,
        jitter: tuple[float, float, int],
        queued_samples: int,
    ) -> None:
        """Let the C receiver take the packets that continue the stream from `addr`.

        `expectation`: (next sequence number, timestamp, payload bytes, SSRC) from the reorder
        buffer; `jitter`: (ticks, last arrival s, last RTP timestamp); `queued_samples`: what the
        leg's batch in progress holds, so the C path's first batch completes it and batches keep
        their size. An address that is not an IP address leaves the leg unarmed."""
        try:
            packed = socket.inet_pton(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET, addr[0])
        except (OSError, TypeError, IndexError):
            return
        next_seq, timestamp, payload_bytes, ssrc = expectation
        jitter_ticks, jitter_arrival, jitter_timestamp = jitter
        self.armed = self._receiver.arm(
            self._fd, next_seq, ssrc, timestamp, payload_bytes, payload_type, packed, addr[1],
            jitter_ticks, jitter_arrival, jitter_timestamp, queued_samples,
        )  # fmt: skip
        self._payload_type = payload_type

    def take(self, *, disarm: bool) -> FastTake:
        """The counters (and with `disarm` the stream state and the batch in progress) of the
        packets the C receiver took; with `disarm` it stops taking them."""
        taken = self._receiver.take(self._fd, disarm)
        packets, size, arrival, jitter_ticks, jitter_arrival, jitter_timestamp = taken[:6]
        since_arm, next_timestamp, last, pending, foreign_address, foreign_port = taken[6:]
        if disarm:
            self.armed = False
        return FastTake(
            packets, size, arrival, jitter_ticks, jitter_arrival, jitter_timestamp,
            since_arm, next_timestamp, last, pending, self._payload_type, foreign_address, foreign_port,
        )  # fmt: skip
