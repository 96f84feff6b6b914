"""Event ids: UUID4 hex text without a system call per event.

``uuid.uuid4()`` asks the OS for 16 bytes for every id (``os.urandom``: one ``getrandom`` system
call) and builds a ``UUID`` object; at 288 calls that was a quarter of the kb-hooks thread's
time. Here the 122 random bits of an id come from a Mersenne Twister of this module's own,
seeded once per process with 19,968 bits from the OS (``random.Random()``), and are written as
uuid4's text: 32 lower-case hex digits, version 4, the RFC 4122 variant (docs/events.md).

Unique as uuid4's are: every process, and every restart, starts from its own OS seed, so two
processes' ids collide as rarely as random 122-bit values do. A forked child (``os.fork``,
``multiprocessing``'s fork and forkserver start methods: the finals processes) would carry a
copy of its parent's generator and repeat the parent's next ids: ``os.register_at_fork``
reseeds the child from the OS right after the fork. A spawned process imports this module
afresh. The generator is not the ``random`` module's shared one, which any code may
``random.seed(n)``.

The ids are not secrets: the generator's state can be computed from enough consecutive ids.
An ``event_id`` is a de-duplication key, never a credential.
"""

from __future__ import annotations

import os
import random

_VERSION_MASK = 0xF << 76  # bits 76-79 of the 128: the version nibble (RFC 4122 4.1.3)
_VARIANT_MASK = 0b11 << 62  # bits 62-63: the variant (RFC 4122 4.1.1)
_RANDOM_BITS = ((1 << 128) - 1) & ~(_VERSION_MASK | _VARIANT_MASK)
_UUID4_BITS = (0x4 << 76) | (0b10 << 62)  # version 4, variant 10

_generator = random.Random()  # seeded from os.urandom
os.register_at_fork(after_in_child=_generator.seed)  # seed() without an argument: from os.urandom again


def new_event_id() -> str:
    """A fresh ``event_id``: the text ``uuid.uuid4().hex`` has, from this process's generator.

    Safe from any thread: ``getrandbits`` runs under the GIL in one piece."""
    return f"{(_generator.getrandbits(128) & _RANDOM_BITS) | _UUID4_BITS:032x}"
