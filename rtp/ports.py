"""Even RTP port allocation from a configured range (RTCP takes port + 1)."""

from __future__ import annotations

import socket
import threading
from collections import deque

from asr_common.errors import CapacityError


class PortsExhausted(CapacityError):
    """Every even port of the range is in use or could not be bound (a capacity error: 503)."""


class PortAllocator:
    """Hands out even ports in [port_min, port_max] whose pair (port, port + 1) binds on host.

    Allocation probes both UDP ports with a throwaway bind, so ports taken by other programs
    are skipped; the leg still binds for real and reports OSError if it loses a race.
    Released ports go to the back of the queue, which delays their reuse (stray packets of a
    finished call then hit nobody rather than the next call). Thread-safe.
    """

    def __init__(self, host: str, port_min: int, port_max: int) -> None:
        first = port_min + (port_min & 1)
        if not 0 < port_min <= port_max <= 65535 or first + 1 > port_max:
            raise ValueError(
                f"RTP port range {port_min}-{port_max} must lie within 1-65535 and hold at least one even/odd pair"
            )
        self.host = host
        self.port_min = port_min
        self.port_max = port_max
        self._free = deque(range(first, port_max, 2))
        self._in_use: set[int] = set()
        self._lock = threading.Lock()
        self._family = socket.AF_INET6 if ":" in host else socket.AF_INET

    @property
    def capacity(self) -> int:
        return len(self._free) + len(self._in_use)

    @property
    def in_use(self) -> int:
        return len(self._in_use)

    def allocate(self) -> int:
        with self._lock:
            for _ in range(len(self._free)):
                port = self._free.popleft()
                if self._bindable(port) and self._bindable(port + 1):
                    self._in_use.add(port)
                    return port
                self._free.append(port)
        raise PortsExhausted(
            f"no free even RTP port pair in {self.port_min}-{self.port_max} on {self.host}; "
            f"{len(self._in_use)} in use: widen the range or lower the call limit"
        )

    def release(self, port: int) -> None:
        with self._lock:
            if port in self._in_use:
                self._in_use.remove(port)
                self._free.append(port)

    def _bindable(self, port: int) -> bool:
        with socket.socket(self._family, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((self.host, port))
            except OSError:
                return False
        return True
