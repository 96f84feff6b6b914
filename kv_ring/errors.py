"""Errors raised by the cache pool.

`CapacityError` is the family an admission controller catches to answer "busy" (SIP 503);
`SlotStateError` means the caller used a slot handle wrongly (a bug, not load).
"""


class CapacityError(RuntimeError):
    """The node cannot take another stream right now."""


class PoolExhausted(CapacityError):
    """Every slot of a `KvPool` is in use."""


class SlotStateError(RuntimeError):
    """A slot was released twice, or used while not allocated."""
