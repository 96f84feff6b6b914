"""Micro-benchmark of the kb-hooks thread's work per engine event: ``TranscriptProcessor.process``
and the encoding of its events as the publisher does it (``to_json``, ``seq``, the JSON text).

    python -m deploy.bench.kb_micro --baseline main

The workload is realistic hotline text: the calls of ``recipes/testsets/workorder_calls.yaml``
(``--calls`` of them), each turn an utterance of its party's leg under the demo's default route
(its KB, tag rules, analytics rules, work order and masking, ``asr_gateway/dev/data``). An
utterance is sent as the engine sends it: a partial each time a chunk (the route's
``chunk_ms``) added characters, at about four characters a second, then the final with a
``--nbest``-long n-best list (the engine's beam; hypotheses a character or two apart). The
engine emits no partial whose text did not change (``StreamConfig.emit_unchanged_partials``
is off), so neither does the workload.

``--baseline REV`` measures a git revision's ``kb_hooks`` and ``asr_common`` (``git archive``
into a temporary directory) against this tree's in the same run: each tree in a child process
of its own (``deploy.bench.kb_micro_rounds``), the rounds alternated (this, baseline, baseline,
this, ...), every call once per round, after one round of warm-up. Per event the thread's CPU
time (``thread_time_ns``) of the work is summed by kind; the figures are the median and the
minimum over ``--rounds`` of µs per partial and per final. ``same_events`` says whether both trees
published the same JSON for one pass of the workload (``event_id`` and ``ts`` aside). Run it
under ``nice -n 19`` on a shared machine; ``speedup`` compares the minimums, the figures least
moved by other jobs. With the defaults a run takes about 15 s on the 2-core development VM.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from asr_common import allocator
from asr_gateway.dev.demo import demo_config
from asr_gateway.service import DEMO_MODEL_DIR
from deploy.bench import kb_micro_rounds
from deploy.bench.workorder import DEFAULT_SET, MS_PER_CHARACTER, ROLES, LabelledCall, demo_profile, load_set

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("kb_hooks", "asr_common")  # what the measured code imports; a baseline tree holds these
PARTIAL_LATENCY_MS = 35.0
FINAL_LATENCY_MS = 120.0
# ``python -c``: the measured tree first on sys.path, then the rounds module run as a script.
_BOOT = (
    "import runpy, sys; sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[2:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def spoken(text: str) -> str:
    """A turn as the engine writes it: no punctuation or spaces."""
    return "".join(ch for ch in text if ch.isalnum())


def variants(text: str, count: int, rng: random.Random) -> list[tuple[str, float]]:
    """An n-best list: ``text`` first, then hypotheses a character away (substituted, dropped, doubled)."""
    out = [(text, -1.0)]
    for rank in range(1, count):
        at = rng.randrange(len(text))
        if rank % 3 == 1:
            other = text[:at] + text[rng.randrange(len(text))] + text[at + 1 :]
        elif rank % 3 == 2 and len(text) > 1:
            other = text[:at] + text[at + 1 :]
        else:
            other = text[: at + 1] + text[at:]
        out.append((other, -1.0 - 0.7 * rank))
    return out


def call_updates(call: LabelledCall, chunk_ms: int, nbest: int, rng: random.Random) -> list[dict[str, Any]]:
    """The updates the engine sends for ``call``'s turns, in order (``kb_micro_rounds``' form)."""
    out: list[dict[str, Any]] = []
    utterances = dict.fromkeys(ROLES, 0)
    clock_ms = 0
    for role, turn in call.turns:
        text = spoken(turn)
        if not text:
            continue
        tokens = [(ch, clock_ms + MS_PER_CHARACTER * i, None) for i, ch in enumerate(text)]
        common = {"role": role, "utterance_id": utterances[role], "begin_ms": clock_ms, "chunk_ms": chunk_ms}
        shown, chunks = 0, 0
        while shown < len(text):
            chunks += 1
            visible = min(len(text), chunks * chunk_ms // MS_PER_CHARACTER)
            if visible > shown:
                shown = visible
                out.append({**common, "partial": True, "text": text[:shown], "tokens": tokens[:shown],
                            "end_ms": clock_ms + chunks * chunk_ms, "confidence": None, "nbest": [],
                            "latency_ms": PARTIAL_LATENCY_MS})  # fmt: skip
        end_ms = clock_ms + (chunks + 2) * chunk_ms  # the endpoint's trailing silence
        out.append({**common, "partial": False, "text": text, "tokens": tokens, "end_ms": end_ms, "confidence": 0.9,
                    "nbest": variants(text, nbest, rng), "latency_ms": FINAL_LATENCY_MS})  # fmt: skip
        utterances[role] += 1
        clock_ms = end_ms + 800
    return out


def workload(calls: int, nbest: int, seed: int) -> dict[str, Any]:
    """The JSON ``kb_micro_rounds`` reads: the demo's kb_hooks files, its route, the calls' updates."""
    profile = demo_profile()
    settings = demo_config("redis://127.0.0.1:6379/0", DEMO_MODEL_DIR, Path(tempfile.gettempdir())).kb_hooks
    rng = random.Random(seed)
    section = profile.workorder
    return {
        "settings": {
            "kb_sets": {k: str(v) for k, v in settings.kb_sets.items()},
            "tag_rule_sets": {k: str(v) for k, v in settings.tag_rule_sets.items()},
            "analytics_rule_sets": {k: str(v) for k, v in settings.analytics_rule_sets.items()},
            "street_lists": {k: str(v) for k, v in settings.street_lists.items()},
        },
        "context": {
            "redaction": profile.redaction or "mask",
            "kb_set": profile.kb_set,
            "tag_rules": [profile.tag_rules] if profile.tag_rules else [],
            "itn": profile.itn,
            "punctuation": profile.punctuation,
            "analytics_rules": profile.analytics_rules,
            "workorder": None if section is None else {"streets": section.streets, "fillers": section.fillers},
        },
        "calls": [call_updates(call, profile.chunk_ms, nbest, rng) for call in load_set(DEFAULT_SET)[:calls]],
        "chunk_ms": profile.chunk_ms,
    }


def extract(revision: str, into: Path) -> Path:
    """``revision``'s measured packages (git archive) under ``into``; ValueError if git cannot."""
    done = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision, *PACKAGES],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode:
        raise ValueError(f"git archive {revision}: {done.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


class Child:
    """One tree's ``kb_micro_rounds`` process."""

    def __init__(self, tree: Path, workload_path: Path) -> None:
        self.tree = tree
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(tree), kb_micro_rounds.__file__, str(workload_path)],
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready, _, package = self._read().partition(" ")
        if ready != "ready" or not Path(package).is_relative_to(tree):
            raise RuntimeError(f"the measuring process for {tree} did not start (or measured {package!r}): {ready!r}")

    def _read(self) -> str:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        return stdout.readline().strip()

    def ask(self, command: str) -> dict[str, Any]:
        stdin: IO[str] | None = self.process.stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()
        answer: dict[str, Any] = json.loads(self._read())
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)


def figures(rounds: Sequence[dict[str, int]]) -> dict[str, Any]:
    """µs per partial and per final: median and minimum over the rounds."""
    out: dict[str, Any] = {}
    for kind, plural in (("partial", "partials"), ("final", "finals")):
        per_event = [r[f"{kind}_ns"] / r[plural] / 1000 for r in rounds]
        out[f"{kind}_us"] = round(statistics.median(per_event), 2)
        out[f"{kind}_us_min"] = round(min(per_event), 2)
    out["events_per_round"] = rounds[0]["events"]
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    load = workload(args.calls, args.nbest, args.seed)
    with tempfile.TemporaryDirectory(prefix="kb_micro-") as tmp:
        workload_path = Path(tmp) / "workload.json"
        workload_path.write_text(json.dumps(load, ensure_ascii=False), encoding="utf-8")
        trees = {"this": REPO}
        if args.baseline:
            trees["baseline"] = extract(args.baseline, Path(tmp) / "baseline")
        children = {name: Child(tree, workload_path) for name, tree in trees.items()}
        try:
            digests = {name: child.ask("digest")["digest"] for name, child in children.items()}
            for child in children.values():
                child.ask("round 0")  # warm-up
            results: dict[str, list[dict[str, int]]] = {name: [] for name in children}
            order = list(children)
            for number in range(1, args.rounds + 1):
                for name in order if number % 2 else reversed(order):
                    results[name].append(children[name].ask(f"round {number}"))
        finally:
            for child in children.values():
                child.close()
    first = results["this"][0]
    out: dict[str, Any] = {
        "workload": {
            "set": str(DEFAULT_SET.relative_to(REPO)),
            "calls": args.calls,
            "partials": first["partials"],
            "finals": first["finals"],
            "chunk_ms": load["chunk_ms"],
            "nbest": args.nbest,
        },
        "rounds": args.rounds,
        "timer": "thread CPU time per event (thread_time_ns), summed per kind; median and minimum over the rounds",
        "this": figures(results["this"]),
        "allocator": allocator.describe(),
    }
    if args.baseline:
        out["baseline"] = {"revision": args.baseline, **figures(results["baseline"])}
        out["speedup"] = {
            kind: round(out["baseline"][f"{kind}_us_min"] / out["this"][f"{kind}_us_min"], 2)
            for kind in ("partial", "final")
        }
        out["same_events"] = digests["this"] == digests["baseline"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.kb_micro", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--baseline", metavar="REV", help="a git revision measured against this tree in the same run")
    parser.add_argument("--calls", type=int, default=40, help="calls of the set per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per tree (default: %(default)s)")
    parser.add_argument("--nbest", type=int, default=10, help="n-best entries per final (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the n-best variants")
    args = parser.parse_args(argv)
    if min(args.calls, args.rounds, args.nbest) < 1:
        parser.error("--calls, --rounds and --nbest must be at least 1")
    try:
        print(json.dumps(run(args), ensure_ascii=False))
    except ValueError as exc:
        print(f"kb_micro: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    allocator.prefer_jemalloc()
    sys.exit(main())
