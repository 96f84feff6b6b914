"""Calls started but not ended, as the spool's journal records them.

After a crash, the next start reads the journal (checkpoint first, then the event records)
into a ``CallLedger``; every call still open there gets ``call.ended`` with reason
``node_restart``, continuing the call's ``seq``. The ledger follows the journal as it is
written, so a compaction can carry the open calls over in its checkpoint record.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from kb_hooks.events import EventType
from kb_hooks.types import CallContext

NODE_RESTART = "node_restart"
CHECKPOINT_KEY = "checkpoint"


@dataclass
class OpenCall:
    """What a ``call.ended`` of the call needs: its context, key prefix and last ``seq``/stream ms."""

    prefix: str
    sip_call_id: str | None  # the call's source_call_id (the checkpoint's field keeps its first name)
    route: str | None
    seq: int
    ms: int


class CallLedger:
    """call_id -> ``OpenCall`` for every call whose ``call.started`` is journaled and ``call.ended`` not."""

    def __init__(self) -> None:
        self.open: dict[str, OpenCall] = {}

    def note(self, event: dict[str, Any], prefix: str, stream_id: str) -> None:
        """Follow one journaled event (any type)."""
        call_id = str(event["call_id"])
        kind = event["event_type"]
        if kind == EventType.CALL_ENDED:
            self.open.pop(call_id, None)
            return
        ms = int(stream_id.split("-", 1)[0])
        entry = self.open.get(call_id)
        if kind == EventType.CALL_STARTED:
            source_call_id = event.get("source_call_id", event.get("sip_call_id"))  # journals written before it
            self.open[call_id] = OpenCall(prefix, source_call_id, event.get("route"), int(event["seq"]), ms)
        elif entry is not None:
            entry.seq = max(entry.seq, int(event["seq"]))
            entry.ms = max(entry.ms, ms)

    def checkpoint(self) -> str:
        """The checkpoint record (one JSON line) that restores this ledger."""
        calls = {call_id: asdict(entry) for call_id, entry in self.open.items()}
        return json.dumps({CHECKPOINT_KEY: {"open_calls": calls}}, ensure_ascii=False)

    def load_checkpoint(self, record: dict[str, Any]) -> None:
        self.open = {call_id: OpenCall(**fields) for call_id, fields in record["open_calls"].items()}

    @staticmethod
    def context(call_id: str, entry: OpenCall) -> CallContext:
        return CallContext(call_id, entry.sip_call_id, entry.route, key_prefix=entry.prefix)
