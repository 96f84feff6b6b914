"""Errors raised by the cache pool.

`PoolExhausted` belongs to the capacity-error family (`asr_common.errors.CapacityError`) that an
admission controller catches to answer "busy" (SIP 503); `SlotStateError` means the caller used
a slot handle wrongly (a bug, not load).
"""

from asr_common.errors import CapacityError


class PoolExhausted(CapacityError):
    """Every slot of a `KvPool` is in use."""


class SlotStateError(RuntimeError):
    """A slot was released twice, or used while not allocated."""
