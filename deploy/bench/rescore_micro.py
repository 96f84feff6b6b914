"""Micro-benchmark of the finalizer's rescoring call: the bidirectional decoder over the n-best
lists of several utterances that end in the same tick.

    python -m deploy.bench.rescore_micro --arch aishell --streams 16 --threads 1

Utterances last 2-8 s (50-200 encoder frames, drawn with a fixed seed), carry about 4
characters per second, and each has a ``--beam``-long n-best list whose hypotheses differ by a
token or two, as a CTC prefix beam search yields. Each call is one ``attention_rescore`` of all
``--streams`` utterances, timed by the calling thread's CPU time (with one torch thread the
decoder runs in it, so other jobs on a shared machine barely move the number) and by the
wall clock; the minimum of ``--repeat`` calls is the number to compare, for the float and the
int8 decoder (the one the ``*-int8`` backends use), measured in the same run. ``baseline``
is the same work done the simple way, in the same run: one call for all utterances, each
hypothesis with its own copy of the encoder output (source keys/values projected per
hypothesis); ``speedup`` is baseline / grouped CPU time. ``padded_cpu_ms_min``: the grouped call
with every hypothesis padded (``prefix_tree=False``) instead of one prefix tree per utterance.
``per_utterance_ms`` divided by the utterance length is the rescoring cost per second of speech.
The prefix-tree calls run the decoder as the finals do, its tree forward as traced graphs
(``EngineOptions.traced_rescoring``; the first warm-up call traces them), or eagerly with
``--eager``; the baseline and the padded calls always run eagerly, and ``--no-baselines`` skips
them (a quick A/B of ``--eager`` and ``--traced`` runs). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from asr_common import allocator
from asr_core.backends import rescoring_decoder
from asr_core.ctc_search import Hypothesis
from asr_core.model.loader import LoadedModel, load_wenet_model
from deploy.bench.make_random_model import ARCHS, make_random_model
from rescoring.attention import attention_rescore
from rescoring.packing import MAX_CALL_POSITIONS, PADDING_SLACK

CHARS_PER_FRAME = 0.16  # ~4 characters per second at 40 ms frames


def utterances(
    loaded: LoadedModel, streams: int, beam: int, seed: int
) -> tuple[list[torch.Tensor], list[list[Hypothesis]]]:
    """Random encoder outputs and n-best lists shaped like real utterances'."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    vocab = loaded.vocab_size
    outs, nbests = [], []
    for _ in range(streams):
        frames = rng.randint(50, 200)
        outs.append(torch.randn(frames, loaded.d_model, generator=generator))
        base = [rng.randrange(2, vocab - 1) for _ in range(max(1, round(frames * CHARS_PER_FRAME)))]
        nbest = []
        for rank in range(beam):
            tokens = list(base)
            if rank:
                position = rng.randrange(len(tokens))
                if rank % 3 == 1 and len(tokens) > 1:
                    del tokens[position]
                elif rank % 3 == 2:
                    tokens.insert(position, rng.randrange(2, vocab - 1))
                else:
                    tokens[position] = rng.randrange(2, vocab - 1)
            nbest.append(Hypothesis(tuple(tokens), -float(rank)))
        nbests.append(nbest)
    return outs, nbests


@contextlib.contextmanager
def copied_memory(decoder: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``decoder`` fed one copy of the memory per hypothesis row (the baseline): inside, each of
    its calls gets the memory and its mask indexed by the call's ``memory_rows``, and no rows."""

    def per_row(
        _module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        memory, memory_mask, *rest = args
        rows = kwargs.pop("memory_rows")
        return (memory[rows], memory_mask[rows], *rest), kwargs

    hook = decoder.register_forward_pre_hook(per_row, with_kwargs=True)
    try:
        yield decoder
    finally:
        hook.remove()


def time_rescoring(
    decoder_fn: Any, outs: list[torch.Tensor], nbests: list[list[Hypothesis]], loaded: LoadedModel,
    slack: float, warmup: int, repeat: int, positions: float = MAX_CALL_POSITIONS, prefix_tree: bool = True,
) -> tuple[list[float], list[float]]:  # fmt: skip
    """(wall ms, thread CPU ms) of each timed call."""
    times, cpu_times = [], []
    for i in range(warmup + repeat):
        started, cpu_started = time.perf_counter(), time.thread_time()
        attention_rescore(
            decoder_fn, outs, nbests, sos=loaded.sos_id, eos=loaded.eos_id, padding_slack=slack,
            max_positions=positions, prefix_tree=prefix_tree,
        )  # fmt: skip
        if i >= warmup:
            times.append((time.perf_counter() - started) * 1000.0)
            cpu_times.append((time.thread_time() - cpu_started) * 1000.0)
    return times, cpu_times


def run(
    loaded: LoadedModel, streams: int, beam: int, warmup: int, repeat: int, seed: int, *, traced: bool = True,
    baselines: bool = True,
) -> dict[str, Any]:  # fmt: skip
    outs, nbests = utterances(loaded, streams, beam, seed)
    seconds = sum(o.shape[0] for o in outs) * loaded.subsampling * 0.01
    float_decoder = loaded.model.decoder.eval()
    decoders = {
        "float": rescoring_decoder("torch", float_decoder, traced=traced),
        "int8": rescoring_decoder("torch-int8", float_decoder, traced=traced),
    }
    results: dict[str, Any] = {
        "streams": streams, "beam": beam, "speech_s": round(seconds, 2), "rescoring": "traced" if traced else "eager",
    }  # fmt: skip
    for name, decoder in decoders.items():
        times, cpu_times = time_rescoring(decoder, outs, nbests, loaded, PADDING_SLACK, warmup, repeat)
        best = min(cpu_times)
        results[name] = baseline_figures(decoder, outs, nbests, loaded, warmup, repeat, best) if baselines else {}
        results[name] |= {
            "cpu_ms_min": round(best, 2),
            "wall_ms_min": round(min(times), 2),
            "wall_ms_median": round(statistics.median(times), 2),
            "per_utterance_ms": round(best / streams, 2),
            "cpu_s_per_speech_s": round(best / 1000.0 / seconds, 4),
        }
    return results


def baseline_figures(
    decoder: torch.nn.Module, outs: list[torch.Tensor], nbests: list[list[Hypothesis]], loaded: LoadedModel,
    warmup: int, repeat: int, best: float,
) -> dict[str, float]:  # fmt: skip
    """The baseline's and the padded calls' CPU ms and how much ``best`` (ms) saves on each."""
    with copied_memory(decoder) as copying:
        _, baseline = time_rescoring(
            copying, outs, nbests, loaded, math.inf, warmup, repeat, positions=math.inf, prefix_tree=False
        )
    _, padded = time_rescoring(decoder, outs, nbests, loaded, PADDING_SLACK, warmup, repeat, prefix_tree=False)
    return {
        "baseline_cpu_ms_min": round(min(baseline), 2),
        "speedup": round(min(baseline) / best, 2),
        "padded_cpu_ms_min": round(min(padded), 2),
        "prefix_tree_speedup": round(min(padded) / best, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--arch", choices=sorted(ARCHS), help="random-weight model of this architecture")
    source.add_argument("--model", type=Path, help="WeNet model directory")
    parser.add_argument("--streams", type=int, default=16, help="utterances rescored per call")
    parser.add_argument("--beam", type=int, default=10, help="hypotheses per utterance")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--traced", dest="traced", action="store_true", default=True,
        help="prefix-tree calls through the traced graphs, as the finals run them (the default)",
    )  # fmt: skip
    mode.add_argument("--eager", dest="traced", action="store_false", help="prefix-tree calls in eager PyTorch")
    parser.add_argument(
        "--no-baselines", dest="baselines", action="store_false", help="time only the prefix-tree calls"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {
        "model": str(args.model) if args.model else f"random:{args.arch}",
        "threads": args.threads,
        "allocator": allocator.describe(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            model_dir = Path(tmp)
            make_random_model(args.arch, model_dir)
        loaded = load_wenet_model(model_dir)
    figures = run(
        loaded, args.streams, args.beam, args.warmup, args.repeat, args.seed, traced=args.traced,
        baselines=args.baselines,
    )  # fmt: skip
    report.update(figures)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    allocator.prefer_jemalloc()
    sys.exit(main())
