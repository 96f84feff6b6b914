"""``asr-model``: find, fetch, install and check WeNet models (docs/models.md).

    asr-model list [--json]
    asr-model pull NAME [--dest DIR] [--force]
    asr-model install FILE|DIR [--name NAME] [--dest DIR] [--force]
    asr-model check DIR [--chunk-ms 160 ...] [--wav FILE] [--backend torch] [--json]

Models go to ``--dest``, default ``$ASR_MODEL_HOME``, else ``models/`` under the service's
state directory. Exit status: 0 on success, 2 when an input (name, archive, directory, option)
is unusable or a download fails; the message is one line on stderr (``--debug`` adds the
traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from asr_core.audio_io import AudioError
from asr_core.model.errors import ModelLoadError
from asr_core.model.loader import load_wenet_model
from deploy.models import check, store
from deploy.models.catalogue import load_catalogue
from deploy.models.download import DownloadLimits
from deploy.models.errors import ModelStoreError
from deploy.models.layout import RUNTIME_EXPORT
from deploy.models.unpack import UnpackLimits

PROG = "asr-model"
CPU_BACKENDS = ("torch", "torch-int8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Find, fetch, install and check WeNet U2++ models.")
    parser.add_argument("--debug", action="store_true", help="print tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser("list", help="the catalogue of published models")
    listing.add_argument("--json", action="store_true", help="one JSON object per model per line")

    dest_help = f"models directory (default: ${store.MODEL_HOME_ENV}, else models/ under the service's state directory)"
    pull = commands.add_parser("pull", help="download a catalogue model, verify, unpack and install it")
    pull.add_argument("name", help="a name from asr-model list")
    pull.add_argument("--dest", type=Path, help=dest_help)
    pull.add_argument("--force", action="store_true", help="replace an installed model of that name")
    pull.add_argument("--max-bytes", type=int, default=DownloadLimits().max_bytes, help="largest download accepted")

    install = commands.add_parser("install", help="install an archive or model directory carried in by hand")
    install.add_argument("source", type=Path, help=".tar.gz, .tgz, .tar or .zip archive, or a model directory")
    install.add_argument("--name", help="installed directory name (default: the archive's or directory's name)")
    install.add_argument("--dest", type=Path, help=dest_help)
    install.add_argument("--force", action="store_true", help="replace an installed model of that name")

    for sub in (pull, install):
        sub.add_argument(
            "--max-unpacked-bytes", type=int, default=UnpackLimits().max_total_bytes,
            help="most bytes the archive may unpack to",
        )  # fmt: skip

    checking = commands.add_parser("check", help="describe a model directory and run a self-test through the engine")
    checking.add_argument("model_dir", type=Path, metavar="DIR")
    checking.add_argument(
        "--chunk-ms", type=int, nargs="+", default=list(check.CHUNK_SIZES_MS), choices=check.CHUNK_SIZES_MS,
        help="chunk sizes to self-test (default: all)",
    )  # fmt: skip
    checking.add_argument("--wav", type=Path, help="recording for the self-test (default: a bundled 8 kHz call)")
    checking.add_argument(
        "--backend", default="torch", choices=CPU_BACKENDS,
        help="engine backend on the CPU (default: torch, float32, as asr-transcribe; torch-int8 is the service's)",
    )  # fmt: skip
    checking.add_argument("--no-self-test", action="store_true", help="only describe the model")
    checking.add_argument("--json", action="store_true", help="one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ModelStoreError, ModelLoadError, AudioError) as exc:
        if args.debug:
            traceback.print_exception(exc, file=sys.stderr)
        message = " ".join(str(exc).split())
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    except OSError as exc:  # the disk: full, read-only, no permission
        print(f"{PROG}: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (a partial download is kept; the next pull resumes it)", file=sys.stderr)
        return 130


def _home(args: argparse.Namespace) -> Path:
    return args.dest if args.dest is not None else store.default_model_home(os.environ)


def run_list(args: argparse.Namespace) -> int:
    for entry in load_catalogue().models:
        if args.json:
            print(json.dumps(entry.model_dump(mode="json"), ensure_ascii=False))
            continue
        size = f"{entry.size_mb} MB" if entry.size_mb else "size not published"
        print(f"{entry.name}\n  {entry.language}; {entry.architecture}")
        print(f"  data: {entry.data}\n  data licence: {entry.data_licence}")
        print(f"  {size}; sha256: {entry.sha256 or 'not published'}")
        for url in entry.urls:
            print(f"  {url}")
        if entry.notes:
            print(f"  {entry.notes}")
    return 0


def run_pull(args: argparse.Namespace) -> int:
    entry = load_catalogue().get(args.name)
    installed = store.pull(
        entry, _home(args), replace=args.force, progress=sys.stderr,
        download_limits=DownloadLimits(max_bytes=args.max_bytes),
        unpack_limits=UnpackLimits(max_total_bytes=args.max_unpacked_bytes),
    )  # fmt: skip
    print(installed)
    return 0


def run_install(args: argparse.Namespace) -> int:
    limits = UnpackLimits(max_total_bytes=args.max_unpacked_bytes)
    print(store.install(args.source, _home(args), args.name, replace=args.force, limits=limits))
    return 0


def run_check(args: argparse.Namespace) -> int:
    model_dir: Path = args.model_dir
    if not model_dir.is_dir():
        raise ModelStoreError(f"{model_dir}: not a directory")
    if not (model_dir / "final.pt").exists() and (model_dir / RUNTIME_EXPORT).is_file():
        facts = check.describe_runtime_export(model_dir)
        _print_report(dataclasses.asdict(facts), [], None, args.json)
        return 2
    loaded = load_wenet_model(model_dir)
    report = dataclasses.asdict(check.describe(loaded, model_dir))
    results: list[check.SelfTestResult] = []
    warm_up_s = None
    if not args.no_self_test:
        wav, reference = (args.wav, None) if args.wav else check.bundled_recording()
        report["self_test_wav"] = str(wav)
        report["self_test_recording"] = str(wav) if args.wav else f"the bundled call recording {wav.name}"
        report["self_test_reference"] = reference
        report["self_test_backend"] = args.backend
        report["torch_threads"] = torch.get_num_threads()
        warm_up_s, results = check.self_test(loaded, wav, reference, args.chunk_ms, args.backend)
    _print_report(report, results, warm_up_s, args.json)
    return 0


def _print_report(
    report: dict[str, Any], results: list[check.SelfTestResult], warm_up_s: float | None, as_json: bool
) -> None:
    if as_json:
        out = {**report, "self_test": [dataclasses.asdict(r) for r in results]}
        if warm_up_s is not None:
            out["warm_up_s"] = round(warm_up_s, 3)
        print(json.dumps(out, ensure_ascii=False))
        return
    if "advice" in report:
        print(f"{report['model_dir']}: TorchScript runtime export ({RUNTIME_EXPORT})")
        print(f"  parameters: {report['parameters']:,}")
        for name, value in report["exported"].items():
            print(f"  {name}: {value}")
        print(f"  can be served: no: {report['advice']}")
        return
    print(_describe_text(report))
    if results:
        print(f"self-test through the engine ({report['self_test_backend']}, {report['torch_threads']} torch threads, "
              f"warm-up {warm_up_s:.1f} s): {report['self_test_recording']}")  # fmt: skip
        if report["self_test_reference"]:
            print(f"  reference: {report['self_test_reference']}")
        for r in results:
            score = f"  CER {100 * r.cer:.1f} %" if r.cer is not None else ""
            print(f"  {r.chunk_ms:>4} ms  RTF {r.rtf:.3f} ({r.decode_s:.2f} s for {r.audio_s:.2f} s), "
                  f"CPU RTF {r.cpu_rtf:.3f}{score}  {r.text}")  # fmt: skip


def _describe_text(r: dict[str, Any]) -> str:
    conv = f", causal conv kernel {r['conv_kernel']}" if r["conv_kernel"] and r["causal_conv"] else (
        f", conv kernel {r['conv_kernel']} (not causal)" if r["conv_kernel"] else ""
    )  # fmt: skip
    decoder = (
        f"{r['decoder']} ({r['decoder_blocks']} left-to-right + {r['reverse_decoder_blocks']} right-to-left blocks)"
        if r["bidirectional_decoder"]
        else f"{r['decoder']} ({r['decoder_blocks']} blocks, left-to-right only)"
    )
    chunks = [f"use_dynamic_chunk {str(r['dynamic_chunk']).lower()}",
              f"use_dynamic_left_chunk {str(r['dynamic_left_chunk']).lower()}",
              f"static_chunk_size {r['static_chunk_frames']}"]  # fmt: skip
    return "\n".join(
        [
            f"{r['model_dir']}",
            f"  encoder: {r['encoder']}, {r['encoder_blocks']} blocks x {r['d_model']} dims, {r['heads']} heads, "
            f"FFN {r['linear_units']}{conv}",
            f"  decoder: {decoder}",
            f"  parameters: {r['parameters']:,} ({r['parameters'] * 4 / 1e6:.0f} MB as float32)",
            f"  front end: {r['sample_rate']} Hz, {r['fbank_bins']} fbank bins, {r['frame_shift_ms']:g} ms shift; "
            f"encoder frame {r['encoder_frame_ms']} ms, looks ahead {r['right_context_frames']} fbank frames",
            f"  CMVN: {'global_cmvn' if r['cmvn'] else 'none'}",
            f"  vocabulary: {r['vocab_size']} units",
            f"  chunk training: {', '.join(chunks)}",
            f"  streams: {r['streaming']}",
        ]
    )


COMMANDS = {"list": run_list, "pull": run_pull, "install": run_install, "check": run_check}


if __name__ == "__main__":
    sys.exit(main())
