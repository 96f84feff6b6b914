"""Micro-benchmark of the finals' search on real utterances: CTC prefix beam search, the attention
decoder's proposals, attention rescoring (``asr_core.finals.FinalSearch``).

    python -m deploy.bench.finals_micro --streams 8 --threads 1

The bundled hotline recordings (``asr-bench e2e``'s call audio) are decoded by the engine,
``--streams`` copies at once, and every ended utterance's request (CTC top-k and encoder
output) is kept as the finalizer receives it. Then each configuration searches all of them,
``--batch`` utterances per call as the finalizer batches them, timed by this thread's CPU time
(one torch thread: the work runs in this thread), the minimum of ``--repeat`` rounds with the
configurations alternated within each round:

- ``rescore``: WeNet's attention rescoring of the CTC n-best (``attention_beam`` 0; the
  service's default);
- ``reduced``: the cheaper search finals get under surge while they queue or the engine is
  saturated (``FinalSettings.reduced``: a CTC beam of ``engine.surge.finals_beam``, no proposals);
- ``proposals``: a joint route's, ``--attention-beam`` decoder proposals added first, the
  float decoder proposing and the backend's decoder (int8 for ``*-int8``) rescoring;
- ``proposals_same_decoder``: the same with the backend's decoder proposing too (what the int8
  backends did before the float proposer).

The backend's decoder rescores with its prefix-tree forward as traced graphs, as the finals run
it (``EngineOptions.traced_rescoring``; ``--traced``, the default), or eagerly (``--eager``); the
first round traces them, so take ``--repeat`` 2 or more. ``same_transcripts`` is the share of
utterances whose final equals the default's. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from asr_common import allocator
from asr_core.backends import rescoring_decoder
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.finals import FinalRequest, FinalResult, FinalSearch, FinalSettings
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.stream import StreamConfig
from asr_core.surge import SurgeSettings
from asr_gateway.dev.demo import default_model_dir
from deploy.bench.e2e_bench import call_audio


class _Recorder:
    """Stands in for the engine's finals search: keeps every request, then searches as before."""

    def __init__(self, search: FinalSearch) -> None:
        self.search = search
        self.requests: list[FinalRequest] = []

    def run(self, requests: list[FinalRequest], settings: FinalSettings | None = None) -> list[FinalResult]:
        self.requests += [request.portable() for request in requests]
        return self.search.run(requests, settings)


def record_requests(loaded: LoadedModel, streams: int, seconds: float, backend: str) -> list[FinalRequest]:
    """The finals requests of ``streams`` copies of the bundled call audio, decoded by the engine
    (320 ms chunks, 4 left chunks: the demo route's) without its threads."""
    pcm, _ = call_audio(seconds)
    engine = Engine(loaded, EngineOptions(max_streams=streams, max_batch=streams, backend=backend))
    recorder = _Recorder(engine.finalizer.local_search)
    engine.finalizer.local_search = recorder  # type: ignore[assignment]
    config = StreamConfig(chunk_ms=320, left_chunks=4)
    opened = [engine.open_stream(config, lambda event: None) for _ in range(streams)]
    for stream in opened:
        stream.accept_waveform(pcm)
        stream.input_finished()
    while engine.active_streams:
        engine.run_once()
    return recorder.requests


def time_configs(
    searches: dict[str, FinalSearch], requests: list[FinalRequest], batch: int, repeat: int
) -> tuple[dict[str, float], dict[str, list[tuple[int, ...] | None]]]:
    """Minimum CPU seconds per configuration over ``repeat`` alternated rounds, and its finals."""
    best = {name: float("inf") for name in searches}
    finals: dict[str, list[tuple[int, ...] | None]] = {}
    for _ in range(repeat):
        for name, search in searches.items():
            started = time.thread_time()
            results = [r for i in range(0, len(requests), batch) for r in search.run(requests[i : i + batch])]
            best[name] = min(best[name], time.thread_time() - started)
            finals[name] = [r.rescored.tokens if r.rescored else None for r in results]
    return best, finals


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    loaded = load_wenet_model(args.model or default_model_dir())
    requests = record_requests(loaded, args.streams, args.seconds, args.backend)
    float_decoder = loaded.model.decoder.eval()
    decoder = rescoring_decoder(args.backend, float_decoder, traced=args.traced)
    defaults = EngineOptions()
    with_proposals = FinalSettings.for_model(
        loaded, beam=defaults.beam, ctc_weight=defaults.ctc_weight, reverse_weight=defaults.reverse_weight,
        attention_beam=args.attention_beam,
    )  # fmt: skip
    searches = {
        "rescore": FinalSearch(decoder, replace(with_proposals, attention_beam=0)),
        "reduced": FinalSearch(decoder, with_proposals.reduced(SurgeSettings().finals_beam)),
        "proposals": FinalSearch(decoder, with_proposals, proposer=float_decoder),
        "proposals_same_decoder": FinalSearch(decoder, with_proposals),
    }
    cpu_s, finals = time_configs(searches, requests, args.batch, args.repeat)
    default = finals["proposals"]
    return {
        "model": str(args.model or "bundled demo model"),
        "backend": args.backend,
        "rescoring": "traced" if args.traced else "eager",
        "utterances": len(requests),
        "encoder_frames": sum(len(r.topk_values) for r in requests),
        "batch": args.batch,
        "attention_beam": args.attention_beam,
        "threads": args.threads,
        "allocator": allocator.describe(),
        "cpu_ms_min": {name: round(1000 * value, 1) for name, value in cpu_s.items()},
        "per_utterance_ms": {name: round(1000 * value / max(1, len(requests)), 2) for name, value in cpu_s.items()},
        "same_transcripts": {
            name: round(sum(a == b for a, b in zip(tokens, default, strict=True)) / max(1, len(default)), 4)
            for name, tokens in finals.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.finals_micro", description=__doc__)
    parser.add_argument("--model", type=Path, help="WeNet model directory (default: the bundled demo model)")
    parser.add_argument("--backend", default="torch-int8", help="engine backend (default: %(default)s)")
    parser.add_argument("--streams", type=int, default=8, help="copies of the call audio decoded at once")
    parser.add_argument("--seconds", type=float, default=20.0, help="call audio per stream in s")
    parser.add_argument("--batch", type=int, default=16, help="utterances per search call")
    parser.add_argument("--attention-beam", type=int, default=4, help="decoder proposals per utterance")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeat", type=int, default=5)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--traced", dest="traced", action="store_true", default=True,
        help="the rescoring decoder's tree forward as traced graphs, as the finals run it (the default)",
    )  # fmt: skip
    mode.add_argument("--eager", dest="traced", action="store_false", help="the rescoring decoder in eager PyTorch")
    args = parser.parse_args(argv)
    if min(args.streams, args.batch, args.attention_beam, args.threads, args.repeat) < 1:
        parser.error("--streams, --batch, --attention-beam, --threads and --repeat must be at least 1")
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    allocator.prefer_jemalloc()
    sys.exit(main())
