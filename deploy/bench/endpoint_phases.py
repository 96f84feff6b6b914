"""Where utterances end, by chunk size: the trailing-silence rule at chunk ends only (WeNet's
runtime) against at every frame (``engine.endpoint.check_every_frame``, the service's default).

    python -m deploy.bench.endpoint_phases --pause-ms 900 1000 1200 --phases 16

A call of the bundled hotline recordings (``asr-bench e2e``'s sentences) with pauses of
``--pause-ms`` line noise between them is decoded by the serving engine (the service's engine
settings, the bundled demo model) at 160, 320 and 640 ms chunks (the attention window kept, as
surge moves calls), once per rule, from ``--phases`` starting points spread over one 640 ms chunk
(a lead of line noise), so that the chunk ends fall everywhere in the pauses. Every pause is
longer than the 800 ms rule, so each should end an utterance. Per pause length, chunk size and
rule it reports the pauses that ended no utterance, the chunk steps run (reading a chunk's end
again costs steps), and the share of calls whose finals, joined, read the same as at 160 ms.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from asr_common import allocator
from asr_core.engine import Engine
from asr_core.events import Event, Final
from asr_core.model.loader import load_wenet_model
from asr_core.stream import StreamConfig
from asr_gateway.config import load_config
from asr_gateway.dev.demo import DATA_DIR
from asr_gateway.service import engine_options
from deploy.bench.e2e_bench import GAP_NOISE_RMS, call_sentences

LADDER = ((160, 8), (320, 4), (640, 2))
RULES = {"chunk_ends": False, "every_frame": True}


def call(sentences: list[np.ndarray], pause_ms: int, lead_ms: int, seed: int) -> np.ndarray:
    """``sentences`` (16 kHz) after ``lead_ms`` of line noise, each followed by ``pause_ms`` of it."""
    rng = np.random.default_rng(seed)
    pieces = [rng.normal(0.0, GAP_NOISE_RMS, lead_ms * 16)]
    for samples in sentences:
        pieces += [samples, rng.normal(0.0, GAP_NOISE_RMS, pause_ms * 16)]
    return np.clip(np.rint(np.concatenate(pieces)), -32768, 32767).astype(np.int16)


def decode(engine: Engine, calls: list[np.ndarray], chunk_ms: int, left_chunks: int) -> list[list[Final]]:
    """Every call as a stream of ``engine`` at once; each one's finals."""
    finals: list[list[Final]] = [[] for _ in calls]
    streams = []
    for i, audio in enumerate(calls):

        def keep(event: Event, out: list[Final] = finals[i]) -> None:
            if isinstance(event, Final):
                out.append(event)

        stream = engine.open_stream(StreamConfig(chunk_ms=chunk_ms, left_chunks=left_chunks, stream_id=f"c{i}"), keep)
        stream.accept_waveform(audio)
        stream.input_finished()
        streams.append(stream)
    while not all(stream.done.is_set() for stream in streams):
        engine.run_once()
    return finals


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    # Whole calls are handed over at once, so every chunk is "late": not news here.
    logging.getLogger("asr_core.scheduler").setLevel(logging.ERROR)
    options = engine_options(load_config(None, environ={}))
    loaded = load_wenet_model(args.model)
    sentences = [samples for samples, _ in call_sentences(args.seconds, DATA_DIR)]
    leads = [round(i * 640 / args.phases) for i in range(args.phases)]
    out: dict[str, Any] = {
        "model": str(args.model),
        "backend": options.backend,
        "sentences_per_call": len(sentences),
        "pauses_per_call": len(sentences) - 1,  # the last sentence ends with the input
        "phases": args.phases,
        "allocator": allocator.describe(),
        "results": [],
    }
    for pause_ms in args.pause_ms:
        calls = [call(sentences, pause_ms, lead, seed=lead) for lead in leads]
        reference: list[str] | None = None
        for chunk_ms, left_chunks in LADDER:
            for rule, every_frame in RULES.items():
                endpoint = replace(options.endpoint, check_every_frame=every_frame)
                engine = Engine(loaded, replace(options, endpoint=endpoint, max_streams=len(calls), trim_interval_s=0))
                finals = decode(engine, calls, chunk_ms, left_chunks)
                texts = ["".join(f.text for f in got) for got in finals]
                if reference is None:
                    reference = texts  # 160 ms chunks, WeNet's rule: the first configuration
                out["results"].append(
                    {
                        "pause_ms": pause_ms,
                        "chunk_ms": chunk_ms,
                        "rule": rule,
                        "pauses": len(calls) * (len(sentences) - 1),
                        "pauses_missed": sum(max(0, len(sentences) - len(got)) for got in finals),
                        "chunk_steps": engine.stats.chunks,
                        "endpoints_inside_chunks": engine.stats.endpoints_inside_chunks,
                        "same_text_as_160_ms_share": round(
                            sum(a == b for a, b in zip(texts, reference, strict=True)) / len(calls), 3
                        ),
                    }
                )
                print(json.dumps(out["results"][-1]), file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.endpoint_phases", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="asr_core/demo_model", help="WeNet model directory (default: %(default)s)")
    parser.add_argument("--pause-ms", type=int, nargs="+", default=[1000], help="pause lengths between sentences")
    parser.add_argument("--phases", type=int, default=16, help="starting points over one 640 ms chunk")
    parser.add_argument("--seconds", type=float, default=20.0, help="speech per call, whole sentences (default: 20)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args(argv)
    if any(ms <= 0 for ms in args.pause_ms) or args.phases < 1:
        parser.error("--pause-ms must be positive and --phases at least 1")
    print(json.dumps(run(args), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
