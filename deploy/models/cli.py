"""``asr-model``: find, fetch, install and check WeNet models (docs/models.md).

    asr-model list [--json]
    asr-model pull NAME [--dest DIR] [--force]
    asr-model install FILE|DIR [--name NAME] [--dest DIR] [--force]
    asr-model check DIR [--chunk-ms 160 ...] [--wav FILE] [--real-speech DIR] [--backend torch] [--json]

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
import textwrap
import traceback
from collections.abc import Sequence
from pathlib import Path

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
    checking.add_argument(
        "--real-speech", type=Path, metavar="DATA_DIR",
        help="real human recordings to decode too (wav.scp + text); default: $ASR_REAL_SPEECH, else "
        "shared/fixtures/real_speech beside the checkout, skipped when none exists",
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
        resumes = " (the partial download is kept; the next pull resumes it)" if args.command == "pull" else ""
        print(f"{PROG}: interrupted{resumes}", file=sys.stderr)
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
        export = check.describe_runtime_export(model_dir)
        print(json.dumps(dataclasses.asdict(export)) if args.json else _export_text(export))
        return 2
    loaded = load_wenet_model(model_dir)
    facts = check.describe(loaded, model_dir)
    test = real = None
    if not args.no_self_test:
        test = check.self_test(loaded, args.chunk_ms, args.wav, args.backend)
        if args.real_speech is not None:
            real_dir, skipped = args.real_speech, None
        else:
            real_dir, skipped = check.find_real_speech(check.real_speech_candidates())
        real = check.real_speech_test(loaded, real_dir, args.chunk_ms[0], args.backend, skipped)
    if args.json:
        report = {
            **dataclasses.asdict(facts),
            "self_test": dataclasses.asdict(test) if test else None,
            "real_speech": dataclasses.asdict(real) if real else None,
        }
        print(json.dumps(report, ensure_ascii=False))
        return 0
    print(_facts_text(facts))
    if test is not None:
        print(_self_test_text(test))
    if test is not None and real is not None:
        print(_real_speech_text(test, real))
    if facts.notice is not None:
        note = f"NOTE: {facts.notice}"
        print(textwrap.fill(note, width=100, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False))
    return 0


def _facts_text(f: check.ModelFacts) -> str:
    conv = ""
    if f.conv_kernel is not None:
        conv = (
            f", causal conv kernel {f.conv_kernel}" if f.causal_conv else f", conv kernel {f.conv_kernel} (not causal)"
        )
    if f.bidirectional_decoder:
        decoder = f"{f.decoder} ({f.decoder_blocks} left-to-right + {f.reverse_decoder_blocks} right-to-left blocks)"
    else:
        decoder = f"{f.decoder} ({f.decoder_blocks} blocks, left-to-right only)"
    chunks = (
        f"use_dynamic_chunk {str(f.dynamic_chunk).lower()}, "
        f"use_dynamic_left_chunk {str(f.dynamic_left_chunk).lower()}, static_chunk_size {f.static_chunk_frames}"
    )
    return "\n".join(
        [
            f.model_dir,
            f"  encoder: {f.encoder}, {f.encoder_blocks} blocks x {f.d_model} dims, {f.heads} heads, "
            f"FFN {f.linear_units}{conv}",
            f"  decoder: {decoder}",
            f"  parameters: {f.parameters:,} ({f.parameters * 4 / 1e6:.0f} MB as float32)",
            f"  front end: {f.sample_rate} Hz, {f.fbank_bins} fbank bins, {f.frame_shift_ms:g} ms shift; "
            f"encoder frame {f.encoder_frame_ms} ms, looks ahead {f.right_context_frames} fbank frames",
            f"  CMVN: {'global_cmvn' if f.cmvn else 'none'}",
            f"  vocabulary: {f.vocab_size} units",
            f"  chunk training: {chunks}",
            f"  streams: {f.streaming}",
        ]
    )


def _self_test_text(test: check.SelfTest) -> str:
    lines = [
        f"self-test through the engine ({test.backend}, {test.torch_threads} torch threads, "
        f"warm-up {test.warm_up_s:.1f} s): {test.recording}"
    ]
    if test.reference is not None:
        lines.append(f"  reference: {test.reference}")
    for r in test.runs:
        score = f"  CER {100 * r.cer:.1f} %" if r.cer is not None else ""
        lines.append(
            f"  {r.chunk_ms:>4} ms  RTF {r.rtf:.3f} ({r.decode_s:.2f} s for {r.audio_s:.2f} s), "
            f"CPU RTF {r.cpu_rtf:.3f}{score}  {r.text}"
        )
    return "\n".join(lines)


def _real_speech_text(test: check.SelfTest, real: check.RealSpeechTest) -> str:
    """The real recordings' CER beside the bundled recording's, at the same chunk size."""
    if real.skipped is not None:
        return f"real speech: skipped: {real.skipped}"
    bundled = next((r.cer for r in test.runs if r.chunk_ms == real.chunk_ms), None)
    lines = [
        f"real speech through the engine ({real.chunk_ms} ms): {real.data_dir}, "
        f"{len(real.utterances)} utterances, {real.audio_s:.1f} s"
    ]
    for u in real.utterances:
        lines.append(f"  {u.utt_id}  CER {100 * u.cer:5.1f} %  {u.text or '(nothing)'}  [reference: {u.reference}]")
    real_cer = "-" if real.cer is None else f"{100 * real.cer:.1f} %"
    if bundled is None:  # a --wav of one's own: no reference to score it against
        lines.append(f"  CER at {real.chunk_ms} ms: real speech {real_cer}")
    else:
        recording = f"{100 * bundled:.1f} %"
        lines.append(f"  CER at {real.chunk_ms} ms: the bundled recording {recording}, real speech {real_cer}")
    return "\n".join(lines)


def _export_text(export: check.RuntimeExportFacts) -> str:
    lines = [
        f"{export.model_dir}: TorchScript runtime export ({RUNTIME_EXPORT})",
        f"  parameters: {export.parameters:,}",
    ]
    lines += [f"  {name}: {value}" for name, value in export.exported.items()]
    lines.append(f"  can be served: no: {export.advice}")
    return "\n".join(lines)


COMMANDS = {"list": run_list, "pull": run_pull, "install": run_install, "check": run_check}


if __name__ == "__main__":
    sys.exit(main())
