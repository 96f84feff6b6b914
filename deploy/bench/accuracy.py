"""``asr-bench accuracy``: character error rate of a model directory on a test set, per chunk
size and decoding mode.

    asr-bench accuracy --model asr_core/demo_model --testset exp/demo/test_sentences

A test set is a Kaldi/WeNet data directory (``wav.scp`` + ``text``, ``segments`` where
utterances are parts of recordings), WeNet's ``data.list`` (JSON lines with key, wav, txt) or a
directory of WAVs plus ``text`` with ``<utt_id> <transcript>`` per line (``deploy.bench.datasets``;
audio mono 16-bit, 8 or 16 kHz); ``--testset`` takes several, one report each (``{"sets":
[...]}``). Each report lists per mode the ``--worst`` utterances of the finals, aligned with
their references (``diff``: 井盖[-发生了]破损[+了]), and warns (``warnings``, and on stderr)
where a mode's finals score worse than its partials. Each utterance is decoded with the chunk attention mask of
160, 320 and 640 ms chunks (4, 8, 16 encoder frames; equal to chunk-by-chunk streaming with an
unlimited cache) and with full context; CTC greedy search always, plus attention rescoring
of the CTC prefix-beam n-best ("rescore", WeNet's) when ``rescoring.attention`` is available,
and, with ``--attention-beam N`` > 0, "joint": the finals search of a route with
``attention_beam: N``, which adds N hypotheses of the attention decoder's own beam search to the
n-best before rescoring (0, the default, leaves it out, as the service's default finals do).
Prints one JSON object.

``--backend NAME`` (e.g. ``auto``, ``torch-int8``, ``onnxruntime-int8``) instead decodes every
utterance through the shared streaming ``Engine`` with that chunk runner, exactly as calls are
served: 160/320/640 ms chunks (``--chunk-ms`` picks some) with the engine's windowed cache
(``--left-chunks``, default 8), the whole test set's streams batched together; "greedy" is the
last CTC partial of each utterance (what the live partials showed), "rescore" its final (what
the service publishes by default; "joint" with ``--attention-beam N``). ``auto`` is the service's default
on a CPU, ``torch-int8``. There is no full-context row in this mode. Running it for ``torch``
and an INT8 backend on the same test set gives the CER change of INT8 under serving conditions.
(``deploy.bench.accuracy_streaming`` runs the engine.)

Surge's cost in accuracy (asr_core/surge.py): ``--surge-ladder`` runs each size at the left
chunks that keep a 160 ms route's attention window (``--left-chunks`` 8: 320 ms x 4, 640 ms x
2), as surge runs a degraded stream; ``--switch-at S`` adds a run (``160>640ms``) whose streams
start at 160 ms and are moved to the largest ``--chunk-ms`` at their first chunk boundary S
seconds into their audio, mid-utterance, by the engine's own ``Stream.set_chunk``
(``surge.switched``: how many streams' finals say they ended at that size). ``paired`` gives
each mode's CER difference to the first mode's (a switch's also to its target size's), with a
95 % interval from a paired bootstrap over the utterances: decoding is deterministic, so the
noise a difference is held against is which sentences the set holds.

``--hotwords FILE`` (a phrase file as a route names it) decodes every mode twice, without and
with the list (on every utterance, as a route's list reaches its calls' finals; greedy/partials
are not biased), and reports per method the CER and the **name recall**: of the listed phrases'
occurrences in the references, the share the output holds exactly (``names_added``: listed
phrases the output holds where the reference does not), plus a few utterances the list changed.
``--itn`` adds the exact-match rate per numeric class of the service's ITN
(``asr_common.itn``) on hand-written ``class<TAB>spoken<TAB>expected`` pairs
(``recipes/testsets/itn.tsv`` by default, ``--itn-set`` another), with what it got wrong; it
runs alone too (no ``--model``). The street and district names set::

    python -m recipes.recipe --stage more --out asr_core/demo_model --work exp/testsets \
        --sentences recipes/testsets/names.txt
    asr-bench accuracy --model asr_core/demo_model --testset exp/testsets/names --backend auto \
        --chunk-ms 160 --hotwords recipes/testsets/names_hotwords.txt --itn

``--compare KEY=V1,V2`` runs an A/B of one setting in one run: ``chunk_ms=160,320``,
``hotwords=off,FILE``, ``itn=off,on`` (finals' numbers in digits, as a route's ``itn: true``;
``--finals-itn`` turns it on for a whole run) or ``attention_beam=0,4`` (rescore vs joint);
``variants`` holds each value's report, ``changed`` the utterances whose finals differ between
the first and the last value. docs/measure-accuracy.md walks through it.

Audio is read at the model's own rate and its fbank computed with the model's own front end
(``train.yaml``'s ``dataset_conf``): 8 kHz recordings go to an 8 kHz model as they are.

Texts are scored by ``asr_common.scoring`` (punctuation and spaces not counted, as WeNet's
``compute-cer.py``). The demo-model recipe (``recipes``) reads its test sets through
``read_audio`` here, so its features and this benchmark hear the same audio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr
import torch

from asr_common.audio import SAMPLE_RATE, TELEPHONE_RATE
from asr_common.itn import normalize_numbers
from asr_common.scoring import char_errors, corpus_cer, name_hits, scoring_text
from asr_core.audio_io import AudioError, read_pcm16
from asr_core.context_graph import ContextGraph, HotwordsError, load_graph, load_phrases
from asr_core.ctc_search import ctc_greedy_batch, ctc_prefix_beam_search, ctc_topk
from asr_core.finals import FinalRequest, FinalSearch, FinalSettings
from asr_core.frontend import DEFAULT_FRONTEND, FrontendConfig, compute_fbank
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.tokens import tokens_to_text
from asr_gateway.config import EngineSettings
from deploy.bench.accuracy_report import (
    WORST,
    final_method,
    finals_warning,
    paired_difference,
    parse_compare,
    worst_utterances,
)
from deploy.bench.accuracy_streaming import ChunkPlan, PlanError, decode_streaming, surge_left_chunks
from deploy.bench.datasets import DataSetError, load_dataset
from rtp.resample import upsample_recording

CHUNK_MODES = {"160ms": 4, "320ms": 8, "640ms": 16, "full": -1}
CHUNK_SIZES = (160, 320, 640)  # ms, the sizes above
ROUTE_CHUNK_MS = 160  # the service's route chunk size: where a surge ladder starts
EXAMPLES = 8  # utterances listed per mode where the hotwords changed the final
FINAL_METHODS = frozenset({"rescore", "joint"})
ITN_SET = Path(__file__).resolve().parents[2] / "recipes" / "testsets" / "itn.tsv"


def read_audio(testset: Path, rate: int = SAMPLE_RATE) -> list[tuple[str, str, np.ndarray]]:
    """(utt_id, transcript, float32 samples at int16 scale at ``rate`` Hz) per utterance of the
    test set at ``testset`` (any layout of ``deploy.bench.datasets``); ``rate`` is the model's
    (``LoadedModel.frontend.sample_rate``).

    A recording at the model's rate is used as it is; 8 kHz recordings for a 16 kHz model go
    through the service's own upsampler (int16, as calls reach the engine); other rates through
    soxr. A segment is cut from its recording before that (each recording is read once)."""
    items = []
    recordings: dict[Path, tuple[np.ndarray, int]] = {}
    for utt in load_dataset(testset).utterances:
        if utt.wav not in recordings:
            recordings[utt.wav] = read_pcm16(utt.wav)
        samples, source = recordings[utt.wav]
        if utt.begin_s or utt.end_s is not None:
            end = None if utt.end_s is None else round(utt.end_s * source)
            samples = samples[round(utt.begin_s * source) : end]
            if not len(samples):
                raise DataSetError(f"{utt.wav}: segment {utt.utt_id} ({utt.begin_s}-{utt.end_s} s) is past its end")
        audio = samples.astype(np.float32)
        if source == TELEPHONE_RATE and rate == SAMPLE_RATE:
            audio = upsample_recording(samples)
        elif source != rate:
            audio = soxr.resample(audio, source, rate).astype(np.float32)
        items.append((utt.utt_id, utt.text.strip(), audio))
    return items


def read_testset(testset: Path, frontend: FrontendConfig = DEFAULT_FRONTEND) -> list[tuple[str, str, np.ndarray]]:
    """(utt_id, transcript, fbank (T, num_mel_bins)) per line of ``<testset>/text``, with the
    model's own front end (its rate, mel bins, frame length and shift)."""
    return [
        (utt_id, text, compute_fbank(audio, frontend))
        for utt_id, text, audio in read_audio(testset, frontend.sample_rate)
    ]


def _rescorer() -> Any:
    try:
        from rescoring.attention import attention_rescore
    except ImportError:
        return None
    return attention_rescore


@torch.no_grad()
def decode(
    loaded: LoadedModel, feats: list[np.ndarray], chunk: int, beam: int, batch_size: int = 16,
    attention_beam: int = 0, context: ContextGraph | None = None,
) -> dict[str, list[str]]:  # fmt: skip
    """Texts per decoding method for each utterance: "greedy", and when available "rescore"
    (WeNet's attention rescoring) and, with ``attention_beam`` > 0, "joint" (the serving
    engine's finals search: n-best plus attention proposals, ``asr_core.finals``). A
    ``context`` graph biases the prefix search of "rescore" and "joint" (greedy is unbiased,
    like the live partials) and its bonus joins their rescoring score."""
    model = loaded.model
    rescore = _rescorer() if beam > 0 else None
    out: dict[str, list[str]] = {"greedy": []}
    if rescore is not None:
        out["rescore"] = []
    joint = _joint_search(loaded, beam, attention_beam) if rescore is not None and attention_beam > 0 else None
    if joint is not None:
        out["joint"] = []
    for start in range(0, len(feats), batch_size):
        part = feats[start : start + batch_size]
        lens = torch.tensor([len(f) for f in part])
        xs = torch.zeros(len(part), int(lens.max()), part[0].shape[1])
        for i, f in enumerate(part):
            xs[i, : len(f)] = torch.from_numpy(f)
        enc, mask = model.encoder(xs, lens, decoding_chunk_size=chunk, num_decoding_left_chunks=-1)
        enc_lens = mask.squeeze(1).sum(1)
        log_probs = model.ctc_log_probs(enc)  # (B, T', V)
        for tokens in ctc_greedy_batch(log_probs, enc_lens, loaded.blank_id):
            out["greedy"].append(tokens_to_text(tokens, loaded.units))
        if rescore is not None:
            nbests = [
                ctc_prefix_beam_search(log_probs[i, : enc_lens[i]], beam, loaded.blank_id, context)
                for i in range(len(part))
            ]
            keep = [i for i, n in enumerate(nbests) if n]
            results = rescore(
                model.decoder,
                [enc[i, : enc_lens[i]] for i in keep],
                [nbests[i] for i in keep],
                sos=loaded.sos_id,
                eos=loaded.eos_id,
                bonuses=[[h.context_score for h in nbests[i]] for i in keep] if context is not None else None,
            )
            texts = ["" for _ in part]
            for i, result in zip(keep, results, strict=True):
                texts[i] = tokens_to_text(result.tokens, loaded.units)
            out["rescore"].extend(texts)
        if joint is not None:
            requests = [
                FinalRequest(*ctc_topk(log_probs[i, : enc_lens[i]], beam), enc[i, : enc_lens[i]], context)
                for i in range(len(part))
            ]
            for result in joint.run(requests):
                out["joint"].append(tokens_to_text(result.rescored.tokens, loaded.units) if result.rescored else "")
    return out


def _joint_search(loaded: LoadedModel, beam: int, attention_beam: int) -> FinalSearch:
    settings = FinalSettings.for_model(
        loaded, beam=beam, ctc_weight=0.5, reverse_weight=0.3, attention_beam=attention_beam
    )
    return FinalSearch(loaded.model.decoder, settings)


def evaluate(
    model_dir: Path, testset: Path, beam: int = 10, limit: int | None = None, backend: str | None = None,
    left_chunks: int = 8, dtype: str = "float32", attention_beam: int = 0, chunk_ms: tuple[int, ...] = (),
    hotwords: Path | None = None, itn: bool = False, worst: int = WORST, surge_ladder: bool = False,
    switch_at_s: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """CER per chunk mode and decoding method; ``chunk_ms`` keeps only those chunk sizes (all when empty).

    Through the engine (``backend``), ``surge_ladder`` runs each size at the left chunks that
    keep the attention window of a 160 ms route's ``left_chunks`` (as surge does), and
    ``switch_at_s`` adds a run whose streams start at 160 ms and move to the largest size that
    many seconds into their audio (``160>640ms``; ``result["surge"]`` says how many moved).
    ``result["paired"]`` holds every mode's CER difference to the first mode (a switch's also
    to its target size) with a bootstrap interval (``accuracy_report.paired_difference``).

    ``result["worst"]`` holds per mode the ``worst`` utterances of the finals (most errors
    first) with their alignment to the reference, ``result["warnings"]`` a line for each mode
    whose finals score worse than its partials. ``itn`` writes the finals' spoken numbers in
    digits as a route's ``itn: true`` does (for references written with digits).

    With ``hotwords`` (a phrase file, as a route names it) every mode is decoded twice, without
    and with the list, and ``result["hotwords"]`` holds per mode and method the CER and the name
    recall of both runs (the listed phrases are the names)."""
    return _evaluate(
        model_dir, testset, beam, limit, backend, left_chunks, dtype, attention_beam, chunk_ms, hotwords, itn, worst,
        surge_ladder=surge_ladder, switch_at_s=switch_at_s,
    )[0]  # fmt: skip


def _evaluate(
    model_dir: Path, testset: Path, beam: int, limit: int | None, backend: str | None, left_chunks: int,
    dtype: str, attention_beam: int, chunk_ms: tuple[int, ...], hotwords: Path | None, itn: bool, worst: int,
    phrases: Path | None = None, surge_ladder: bool = False, switch_at_s: float | None = None,
) -> tuple[dict[str, Any], dict[str, list[str]]]:  # fmt: skip
    """``evaluate``'s result, and the finals' texts per mode (for ``compare``). ``phrases``: a
    list every decode is biased with, as a route's ``hotwords`` (``compare hotwords=off,FILE``)."""
    if backend == "auto":
        backend = EngineSettings(backend="auto", device="cpu").resolved_backend
    loaded = load_wenet_model(model_dir)
    items = read_audio(testset, loaded.frontend.sample_rate)[:limit]
    ids = [i for i, _, _ in items]
    refs = [t for _, t, _ in items]
    audio = [a for _, _, a in items]
    feats = [compute_fbank(a, loaded.frontend) for a in audio] if backend is None else []
    graph = load_graph(hotwords, loaded.units) if hotwords is not None else None
    always = load_graph(phrases, loaded.units) if phrases is not None else None
    ref_chars = sum(len(scoring_text(r)) for r in refs)
    result: dict[str, Any] = {
        "model": str(model_dir),
        "testset": str(testset),
        "utterances": len(items),
        "reference_chars": ref_chars,
        "cer": {},
        "examples": {},
        "worst": {},
        "warnings": [],
    }
    wanted = [ms for ms in CHUNK_SIZES if not chunk_ms or ms in chunk_ms]
    runs: list[tuple[str, int | ChunkPlan]]
    if backend is None:
        runs = [(f"{ms}ms", CHUNK_MODES[f"{ms}ms"]) for ms in wanted]
        if not chunk_ms:
            runs.append(("full", CHUNK_MODES["full"]))
    else:
        result.update(backend=backend, left_chunks=left_chunks, dtype=dtype)
        plans = chunk_plans(loaded, left_chunks, tuple(wanted), surge_ladder, switch_at_s)
        runs = [(plan.mode, plan) for plan in plans]
        if surge_ladder or switch_at_s is not None:
            result["surge"] = {"left_chunks": {plan.mode: plan.left_chunks for plan in plans}, "switched": {}}
            if switch_at_s is not None:
                result["surge"]["switch_at_s"] = switch_at_s
    if itn:
        result["itn_on_finals"] = True
    names: list[str] = []
    if hotwords is not None:
        names = [phrase.text for phrase in load_phrases(hotwords)]
        said = name_hits(refs, refs, names)[1]
        result["hotwords"] = {"file": str(hotwords), "phrases": len(names), "names_in_references": said}

    def run(spec: int | ChunkPlan, context: ContextGraph | None) -> dict[str, list[str]]:
        if isinstance(spec, int):
            hyps = decode(loaded, feats, spec, beam, attention_beam=attention_beam, context=context)
        else:
            assert backend is not None
            streamed = decode_streaming(loaded, audio, spec, backend, left_chunks, dtype, attention_beam, context)
            hyps = streamed.texts
            if spec.switch_to is not None:
                result["surge"]["switched"][spec.mode] = streamed.switched
        if itn:
            for method in FINAL_METHODS & hyps.keys():
                hyps[method] = [normalize_numbers(text).text for text in hyps[method]]
        return hyps

    finals: dict[str, list[str]] = {}
    by_mode: dict[str, dict[str, list[str]]] = {}  # mode -> method -> text per utterance
    for mode, spec in runs:
        started = time.monotonic()
        hyps = run(spec, always)
        by_mode[mode] = hyps
        result["cer"][mode] = {method: round(corpus_cer(texts, refs), 4) for method, texts in hyps.items()}
        result["cer"][mode]["seconds"] = round(time.monotonic() - started, 1)
        result["examples"][mode] = [{"ref": r, "hyp": h} for r, h in list(zip(refs, hyps["greedy"], strict=True))[:3]]
        method = final_method(hyps)
        finals[mode] = hyps[method]
        result["worst"][mode] = {"method": method, "utterances": worst_utterances(ids, refs, hyps[method], worst)}
        warning = finals_warning(mode, result["cer"][mode])
        if warning is not None:
            result["warnings"].append(warning)
        if graph is not None:
            biased = run(spec, graph)
            result["hotwords"][mode] = {
                "without": _name_scores(hyps, refs, names),
                "with": _name_scores(biased, refs, names),
                "changed": _changed_names(hyps, biased, refs, names),
            }
    result["paired"] = _paired(runs, by_mode, refs)
    return result, finals


def chunk_plans(
    loaded: LoadedModel, left_chunks: int, sizes: tuple[int, ...], surge_ladder: bool, switch_at_s: float | None
) -> list[ChunkPlan]:
    """The engine runs of chunk ``sizes`` (ms, ascending): each keeping ``left_chunks``, or with
    ``surge_ladder`` the left chunks that keep a 160 ms route's window; with ``switch_at_s``
    then one that starts at 160 ms and moves to the largest size (a switch implies the ladder:
    its streams can move only on it). ``PlanError`` when the sizes do not allow it."""
    if switch_at_s is not None and (ROUTE_CHUNK_MS not in sizes or len(sizes) < 2):
        raise PlanError(f"--switch-at moves streams from {ROUTE_CHUNK_MS} ms to a larger size: give both in --chunk-ms")
    ladder = surge_ladder or switch_at_s is not None
    left = surge_left_chunks(loaded, ROUTE_CHUNK_MS, left_chunks, sizes) if ladder else {}
    plans = [ChunkPlan(ms, left.get(ms, left_chunks)) for ms in sizes]
    if switch_at_s is not None:
        plans.append(ChunkPlan(ROUTE_CHUNK_MS, left_chunks, switch_to=sizes[-1], switch_at_s=switch_at_s))
    return plans


def _paired(
    runs: list[tuple[str, int | ChunkPlan]], texts: dict[str, dict[str, list[str]]], refs: list[str]
) -> list[dict[str, Any]]:
    """Each mode's CER difference (per method) to the first mode's, and a switched run's also to
    its target size's: what the change costs, and whether the set can tell it from chance."""
    pairs = [(runs[0][0], mode) for mode, _ in runs[1:]]
    pairs += [
        (f"{spec.switch_to}ms", mode)
        for mode, spec in runs
        if isinstance(spec, ChunkPlan) and spec.switch_to is not None and f"{spec.switch_to}ms" in texts
    ]
    return [
        {
            "first": first,
            "second": second,
            **{
                method: paired_difference(refs, texts[first][method], texts[second][method])
                for method in texts[first]
                if method in texts[second]
            },
        }
        for first, second in pairs
    ]


def compare(
    model_dir: Path, testset: Path, key: str, values: list[str], beam: int = 10, limit: int | None = None,
    backend: str | None = None, left_chunks: int = 8, dtype: str = "float32", attention_beam: int = 0,
    chunk_ms: tuple[int, ...] = (), itn: bool = False, worst: int = WORST, surge_ladder: bool = False,
    switch_at_s: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """An A/B (or A/B/C...) of one setting on one test set: every value's ``evaluate`` result
    under ``variants``, and ``changed``: utterances whose finals differ between the first and
    the last value, with each one's errors (what the change fixed or broke)."""
    base = dict(
        beam=beam, limit=limit, backend=backend, left_chunks=left_chunks, dtype=dtype,
        attention_beam=attention_beam, chunk_ms=chunk_ms, hotwords=None, itn=itn, worst=worst, phrases=None,
        surge_ladder=surge_ladder, switch_at_s=switch_at_s,
    )  # fmt: skip
    variants: list[dict[str, Any]] = []
    texts: list[list[str]] = []
    for value in values:
        settings: dict[str, Any] = dict(base)
        if key == "chunk_ms":
            settings["chunk_ms"] = (int(value),)
        elif key == "hotwords":
            settings["phrases"] = None if value == "off" else Path(value)
        elif key == "itn":
            settings["itn"] = value == "on"
        else:
            settings["attention_beam"] = int(value)
        result, finals = _evaluate(model_dir, testset, **settings)
        variants.append({"value": value, **result})
        # one mode per variant when chunk_ms varies; else the first mode run
        texts.append(next(iter(finals.values()), []))
    refs = [(u.utt_id, u.text.strip()) for u in load_dataset(testset).utterances][:limit]
    changed = []
    for (utt_id, ref), first, last in zip(refs, texts[0], texts[-1], strict=True):
        if first != last:
            changed.append(
                {
                    "id": utt_id,
                    "ref": ref,
                    values[0]: {"errors": char_errors(first, ref)[0], "hyp": first},
                    values[-1]: {"errors": char_errors(last, ref)[0], "hyp": last},
                }
            )
    return {"testset": str(testset), "compare": key, "variants": variants, "changed": changed[:EXAMPLES]}


def _name_scores(hyps: dict[str, list[str]], refs: list[str], names: list[str]) -> dict[str, dict[str, float]]:
    """Per method: CER, name recall (names recognized / names said) and names added where not said."""
    scores = {}
    for method, texts in hyps.items():
        hits, said, added = name_hits(texts, refs, names)
        scores[method] = {
            "cer": round(corpus_cer(texts, refs), 4),
            "name_recall": round(hits / max(1, said), 4),
            "names_recognized": hits,
            "names_added": added,
        }
    return scores


def _changed_names(
    without: dict[str, list[str]], biased: dict[str, list[str]], refs: list[str], names: list[str]
) -> list[dict[str, str]]:
    """A few utterances whose final ("joint", else "rescore") differs with the list: what it fixed or broke."""
    method = "joint" if "joint" in biased else "rescore" if "rescore" in biased else "greedy"
    changed = [
        {"ref": ref, "without": a, "with": b}
        for ref, a, b in zip(refs, without[method], biased[method], strict=True)
        if a != b
    ]
    return changed[:EXAMPLES]


def itn_accuracy(path: Path) -> dict[str, Any]:
    """Exact-match rate per numeric class of the service's ITN (``asr_common.itn``) on a
    hand-written set: ``class <TAB> spoken <TAB> expected`` per line (``#`` comments)."""
    per_class: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"{path}:{number}: expected 'class<TAB>spoken<TAB>expected', got {line!r}")
        kind, spoken, expected = (field.strip() for field in fields)
        got = normalize_numbers(spoken).text
        entry = per_class.setdefault(kind, {"cases": 0, "exact": 0, "wrong": []})
        entry["cases"] += 1
        if got == expected:
            entry["exact"] += 1
        else:
            entry["wrong"].append({"spoken": spoken, "expected": expected, "got": got})
    for entry in per_class.values():
        entry["exact_match"] = round(entry["exact"] / entry["cases"], 4)
    cases = sum(e["cases"] for e in per_class.values())
    exact = sum(e["exact"] for e in per_class.values())
    return {"set": str(path), "cases": cases, "exact_match": round(exact / max(1, cases), 4), "classes": per_class}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="WeNet model dir (needed unless only --itn)")
    parser.add_argument(
        "--testset", type=Path, nargs="+", default=[], metavar="SET",
        help="a Kaldi/WeNet data dir (wav.scp + text [+ segments]), a data.list, or a dir of WAVs + text; "
        "several: one report each (needed unless only --itn)",
    )  # fmt: skip
    parser.add_argument("--beam", type=int, default=10, help="n-best size for rescoring; 0 = greedy only")
    parser.add_argument("--limit", type=int, help="only the first N utterances")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--backend", help="decode through the streaming engine with this chunk runner (auto: the service's default)"
    )
    parser.add_argument(
        "--chunk-ms", type=int, nargs="+", default=(), choices=(160, 320, 640), help="only these chunk sizes"
    )
    parser.add_argument("--left-chunks", type=int, default=8, help="with --backend: the cache window in chunks")
    parser.add_argument(
        "--surge-ladder", action="store_true",
        help="with --backend: run each chunk size at the left chunks that keep the attention window of a 160 ms "
        "route's --left-chunks, as surge does (160x8 = 320x4 = 640x2)",
    )  # fmt: skip
    parser.add_argument(
        "--switch-at", type=float, metavar="S",
        help="with --backend: also a run whose streams start at 160 ms and move to the largest --chunk-ms S seconds "
        "into their audio (Stream.set_chunk, as surge moves them; implies --surge-ladder)",
    )  # fmt: skip
    parser.add_argument("--dtype", default="float32", help="with --backend: float32, or bfloat16 where supported")
    parser.add_argument(
        "--attention-beam", type=int, default=0,
        help="attention proposals of joint finals (default 0: rescore, the service's default finals)",
    )  # fmt: skip
    parser.add_argument(
        "--hotwords", type=Path, metavar="FILE",
        help="a route's phrase file: decode without and with it, and report name recall (the phrases are the names)",
    )  # fmt: skip
    parser.add_argument("--itn", action="store_true", help="also score the service's ITN per numeric class")
    parser.add_argument(
        "--itn-set", type=Path, default=ITN_SET, help="class<TAB>spoken<TAB>expected lines (default: the repo's set)"
    )
    parser.add_argument(
        "--finals-itn", action="store_true", help="spoken numbers in digits in the finals (references with digits)"
    )
    parser.add_argument(
        "--compare", metavar="KEY=V1,V2",
        help="an A/B in one run: chunk_ms=160,320 | hotwords=off,FILE | itn=off,on | attention_beam=0,4",
    )  # fmt: skip
    parser.add_argument("--worst", type=int, default=WORST, help="utterances with the most errors listed per mode")
    args = parser.parse_args(argv)
    if args.attention_beam < 0:
        parser.error("--attention-beam must be 0 or more")
    if (args.model is None) != (not args.testset) or (args.model is None and not args.itn):
        parser.error("give --model and --testset (or only --itn)")
    if args.backend is None and (args.surge_ladder or args.switch_at is not None):
        parser.error("--surge-ladder and --switch-at decode through the engine: give --backend (e.g. auto)")
    if args.switch_at is not None and args.switch_at < 0:
        parser.error("--switch-at is seconds into each utterance's audio, 0 or more")
    if args.compare and args.hotwords is not None:
        parser.error("--hotwords already compares without and with the list; leave out --compare")
    result: dict[str, Any] = {}
    try:
        if args.hotwords is not None:
            load_phrases(args.hotwords)  # a bad file fails before any decoding
        itn = itn_accuracy(args.itn_set) if args.itn else None
        comparing = parse_compare(args.compare) if args.compare else None
        for testset in args.testset:
            load_dataset(testset)  # a broken list fails before any decoding
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    reports = []
    torch.set_num_threads(args.threads)
    common: dict[str, Any] = dict(
        beam=args.beam, limit=args.limit, backend=args.backend, left_chunks=args.left_chunks, dtype=args.dtype,
        attention_beam=args.attention_beam, chunk_ms=tuple(sorted(args.chunk_ms)), itn=args.finals_itn,
        worst=args.worst, surge_ladder=args.surge_ladder, switch_at_s=args.switch_at,
    )  # fmt: skip
    for testset in args.testset:
        try:
            if comparing is not None:
                report = compare(args.model, testset, *comparing, **common)
                warnings = [w for variant in report["variants"] for w in variant["warnings"]]
            else:
                report = evaluate(args.model, testset, hotwords=args.hotwords, **common)
                warnings = report["warnings"]
        except (HotwordsError, AudioError, DataSetError, PlanError) as exc:  # e.g. a phrase the units cannot spell
            parser.error(str(exc))
        for warning in warnings:
            print(f"warning: {testset}: {warning}", file=sys.stderr)
        reports.append(report)
    if len(reports) == 1:
        result = reports[0]
    elif reports:
        result = {"sets": reports}
    if itn is not None:
        result["itn"] = itn
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
