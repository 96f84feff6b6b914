"""Pooled, windowed attention and convolution caches for streaming encoders.

A fixed pool of slots (one per stream), ring writes of each new chunk, batched gathers
with validity masks, memory accounting. Knows nothing about audio or text.
"""

from kv_ring.errors import PoolExhausted, SlotStateError
from kv_ring.memory import CacheGeometry, plan_pool
from kv_ring.pool import CacheView, KvPool

__all__ = [
    "CacheGeometry",
    "CacheView",
    "KvPool",
    "PoolExhausted",
    "SlotStateError",
    "plan_pool",
]
