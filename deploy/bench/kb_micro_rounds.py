"""The measuring side of ``deploy.bench.kb_micro``: one source tree's kb-hooks work, round by round.

Started by ``kb_micro`` as ``python -c`` with the tree to measure first on ``sys.path``, so this
file imports that tree's ``kb_hooks`` (an older revision's, for the baseline); it therefore uses
only what every revision offers: ``KbHooksSettings``, ``TranscriptProcessor.process``,
``end_call``, ``CallContext``, ``TranscriptUpdate`` and ``Event.to_json``; the publisher's JSON
text is ``journal_records.event_payload``, or ``json.dumps`` in revisions without it.

Protocol on stdin/stdout, one line each: once the workload is loaded it prints ``ready`` and the
directory its ``kb_hooks`` came from; then ``round N`` runs every call of the workload once and
prints a JSON object (ns and counts per kind); ``digest`` prints the sha-256 of every published
JSON of one pass (``event_id`` by its order of appearance, ``ts`` by a constant), so two trees
can be compared; end of input stops it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import kb_hooks
from kb_hooks.config import KbHooksSettings
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import CallContext, Participant, RedactionMode, TranscriptUpdate, WorkorderOptions

_EVENT_ID = re.compile(r"[0-9a-f]{32}")  # the form of an event_id (docs/events.md)

try:
    from kb_hooks.journal_records import event_payload
except ImportError:  # a baseline revision from before event_payload: its publisher called json.dumps
    event_payload = functools.partial(json.dumps, ensure_ascii=False)

Workload = dict[str, Any]
"""``kb_micro.workload``'s JSON: ``settings`` (the kb_hooks file sets), ``context`` (a route's
``CallContext`` fields) and ``calls`` (each a list of updates in the order the engine sends them)."""


def processor_of(workload: Workload) -> TranscriptProcessor:
    files = workload["settings"]
    settings = KbHooksSettings(
        kb_sets={name: Path(path) for name, path in files["kb_sets"].items()},
        tag_rule_sets={name: Path(path) for name, path in files["tag_rule_sets"].items()},
        analytics_rule_sets={name: Path(path) for name, path in files["analytics_rule_sets"].items()},
        street_lists={name: Path(path) for name, path in files["street_lists"].items()},
    )
    return TranscriptProcessor.from_settings(settings)


def context_of(fields: dict[str, Any], call_id: str) -> CallContext:
    section = fields["workorder"]
    workorder = None
    if section is not None:
        fillers = section["fillers"]
        workorder = (
            WorkorderOptions(section["streets"])
            if fillers is None
            else WorkorderOptions(section["streets"], tuple(fillers))
        )
    return CallContext(
        call_id=call_id,
        redaction=RedactionMode(fields["redaction"]),
        kb_set=fields["kb_set"],
        tag_rules=tuple(fields["tag_rules"]),
        itn=fields["itn"],
        punctuation=fields["punctuation"],
        analytics_rules=fields["analytics_rules"],
        workorder=workorder,
    )


def updates_of(call: list[dict[str, Any]], ctx: CallContext) -> list[TranscriptUpdate]:
    parties = {role: Participant(role, f"sip:{role}@bench.invalid") for role in ("caller", "agent")}
    return [
        TranscriptUpdate(
            call=ctx,
            participant=parties[u["role"]],
            utterance_id=u["utterance_id"],
            is_partial=u["partial"],
            text=u["text"],
            tokens=tuple((text, begin, end) for text, begin, end in u["tokens"]),
            begin_offset_ms=u["begin_ms"],
            end_offset_ms=u["end_ms"],
            confidence=u["confidence"],
            nbest=tuple((text, score) for text, score in u["nbest"]),
            latency_ms=u["latency_ms"],
            chunk_ms=u["chunk_ms"],
        )
        for u in call
    ]


def run_round(workload: Workload, processor: TranscriptProcessor, number: int) -> dict[str, int]:
    """Every call once; per kind the ns spent in ``process`` and in encoding its events as the
    tree's publisher does (``to_json``, ``seq`` added, its JSON text), and the counts."""
    ns = {"partial": 0, "final": 0}
    count = {"partial": 0, "final": 0}
    published = 0
    clock = time.thread_time_ns  # CPU time: what other jobs on a shared machine take is not counted
    for index, call in enumerate(workload["calls"]):
        ctx = context_of(workload["context"], f"bench-{number}-{index}")
        seq = 0
        for update in updates_of(call, ctx):
            start = clock()
            for event in processor.process(update):
                wire = event.to_json()
                seq += 1
                wire["seq"] = seq
                event_payload(wire)
                published += 1
            kind = "partial" if update.is_partial else "final"
            ns[kind] += clock() - start
            count[kind] += 1
        processor.end_call(ctx.call_id)
    return {
        "partial_ns": ns["partial"],
        "partials": count["partial"],
        "final_ns": ns["final"],
        "finals": count["final"],
        "events": published,
    }


def digest(workload: Workload, processor: TranscriptProcessor) -> str:
    """The sha-256 of one pass's published JSON: each ``event_id`` (wherever it appears) replaced by
    its order of appearance, ``ts`` by a constant."""
    lines: list[str] = []
    ids: dict[str, str] = {}
    for index, call in enumerate(workload["calls"]):
        ctx = context_of(workload["context"], f"digest-{index}")
        for update in updates_of(call, ctx):
            for event in processor.process(update):
                wire = event.to_json()
                ids[wire["event_id"]] = f"<event {len(ids)}>"
                wire["ts"] = "<ts>"
                lines.append(json.dumps(wire, ensure_ascii=False))  # key order compared too
        processor.end_call(ctx.call_id)
    text = _EVENT_ID.sub(lambda m: ids.get(m.group(), m.group()), "\n".join(lines))
    return hashlib.sha256(text.encode()).hexdigest()


def serve(workload_path: str) -> None:
    workload: Workload = json.loads(Path(workload_path).read_text(encoding="utf-8"))
    processor = processor_of(workload)
    print(f"ready {Path(kb_hooks.__file__).parent}", flush=True)
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "round":
            print(json.dumps(run_round(workload, processor, int(argument))), flush=True)
        elif command == "digest":
            print(json.dumps({"digest": digest(workload, processor)}), flush=True)
        else:
            raise SystemExit(f"kb_micro_rounds: unknown command {line.strip()!r} (round N, digest)")


if __name__ == "__main__":
    serve(sys.argv[1])
