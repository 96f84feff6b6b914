"""The capacity-error family: one base class that every "the node is full" error derives from.

Admission control (SIP's 503 with Retry-After) catches ``CapacityError`` and nothing broader,
so a bug in the application is never mistaken for a busy node; each layer raises its own
subclass (``kv_ring.PoolExhausted``: no cache slot; ``rtp.ports.PortsExhausted``: no RTP port;
``calls.handler.LegsExhausted``: a handler's own leg limit).
"""


class CapacityError(RuntimeError):
    """The node cannot take another stream or call right now; try again later (SIP 503)."""
