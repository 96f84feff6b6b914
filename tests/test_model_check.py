"""asr-model check: facts of the demo model and the WeNet fixture, a self-test through the
engine (one chunk size, to stay fast), runtime exports refused with advice, errors as one line;
real human speech (the shared AISHELL-1 fixture) decoded beside the bundled recording, and the
demo model named as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asr_core.cli_transcribe import DEMO_MODEL_DIR
from asr_core.model.bundled import is_demo_model
from deploy.models import check
from deploy.models.cli import main
from deploy.models.errors import ModelStoreError
from deploy.models.store import install

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "wenet_u2pp_small"
needs_fixture = pytest.mark.skipif(
    not (FIXTURE / "model" / "final.pt").is_file(), reason=f"WeNet fixture not found at {FIXTURE}"
)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["check", *argv, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_check_demo_model_describes_it_and_self_tests_through_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, str(DEMO_MODEL_DIR), "--chunk-ms", "640")
    assert report["encoder"] == "conformer" and report["encoder_blocks"] == 6 and report["d_model"] == 144
    assert report["heads"] == 4 and report["bidirectional_decoder"] is True
    assert report["decoder_blocks"] == 2 and report["reverse_decoder_blocks"] == 1
    assert report["vocab_size"] == 2548 and report["sample_rate"] == 16000 and report["fbank_bins"] == 80
    assert report["cmvn"] is True and report["dynamic_chunk"] is True and report["can_stream"] is True
    assert 6_000_000 < int(str(report["parameters"])) < 7_000_000
    test = report["self_test"]
    assert isinstance(test, dict) and test["reference"] == "早上七点多北京路附近暖气不热"
    (run,) = test["runs"]
    assert run["chunk_ms"] == 640 and run["rtf"] > 0 and run["cpu_rtf"] > 0
    assert run["text"] and run["cer"] is not None  # the bundled call has a reference
    assert report["demo"] is True and "asr-model pull NAME" in str(report["notice"])
    real = report["real_speech"]
    assert isinstance(real, dict) and real["skipped"] is None and real["chunk_ms"] == 640
    assert len(real["utterances"]) == 6 and real["cer"] > 0.8  # synthetic voices only: it hears no person


@needs_fixture
def test_check_fixture_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    wav = FIXTURE / "wav" / "utt1.wav"
    assert main(["check", str(FIXTURE / "model"), "--chunk-ms", "160", "--wav", str(wav)]) == 0
    out = capsys.readouterr().out
    assert "encoder: conformer, 4 blocks x 128 dims, 4 heads, FFN 256, causal conv kernel 15" in out
    assert "decoder: bitransformer (2 left-to-right + 1 right-to-left blocks)" in out
    assert "vocabulary: 60 units" in out and "CMVN: global_cmvn" in out
    assert "use_dynamic_chunk true" in out and "streams: yes" in out
    (run,) = [line for line in out.splitlines() if " 160 ms  RTF " in line]
    assert "CER" not in run  # no reference for a --wav of one's own
    (summary,) = [line for line in out.splitlines() if line.strip().startswith("CER at 160 ms:")]
    assert summary.strip().startswith("CER at 160 ms: real speech ") and "recording" not in summary
    assert "NOTE:" not in out  # not the bundled demo model


@needs_fixture
def test_check_full_context_model_says_it_will_not_stream_well(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = install(FIXTURE / "model", tmp_path, "full", replace=False)
    config = (model / "train.yaml").read_text(encoding="utf-8")
    (model / "train.yaml").write_text(config.replace("use_dynamic_chunk: true", "use_dynamic_chunk: false"))
    report = run_json(capsys, str(model), "--no-self-test")
    assert report["can_stream"] is False and str(report["streaming"]).startswith("no: trained on full context")
    assert report["self_test"] is None


class _RuntimeExport(torch.nn.Module):
    """What WeNet's TorchScript export exposes besides its graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(80, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)

    @torch.jit.export
    def subsampling_rate(self) -> int:
        return 4

    @torch.jit.export
    def right_context(self) -> int:
        return 6

    @torch.jit.export
    def is_bidirectional_decoder(self) -> bool:
        return True


def test_runtime_export_is_read_and_refused_with_advice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export = tmp_path / "libtorch"
    export.mkdir()
    quantized = torch.ao.quantization.quantize_dynamic(_RuntimeExport(), {torch.nn.Linear}, dtype=torch.qint8)
    torch.jit.script(quantized).save(str(export / "final.zip"))  # as WeNet's x86 exports: int8 Linears
    (export / "units.txt").write_text("<blank> 0\n", encoding="utf-8")
    assert main(["check", str(export), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["servable"] is False and report["parameters"] == 80 * 16 + 16
    assert report["exported"] == {"subsampling_rate": 4, "right_context": 6, "is_bidirectional_decoder": True}
    assert "_exp.tar.gz" in report["advice"]
    with pytest.raises(ModelStoreError, match="cannot be served"):
        install(export, tmp_path / "models", None, replace=False)


def test_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", "no-such-model", "--dest", str(tmp_path)]) == 2
    assert main(["check", str(tmp_path / "absent")]) == 2
    assert main(["install", str(tmp_path / "absent.tar.gz"), "--dest", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("asr-model: error: ") for line in err)
    assert "no model 'no-such-model'" in err[0] and "not a directory" in err[1] and "no such file" in err[2]


def test_list_prints_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--json"]) == 0
    entries = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["name"] for e in entries][:1] == ["aishell-u2pp-conformer"]
    assert all(e["sha256"] == "" for e in entries)


REAL_SPEECH = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real_speech"


def test_check_prints_the_real_speech_cer_beside_the_recordings_and_names_the_demo_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", str(DEMO_MODEL_DIR), "--chunk-ms", "640", "--real-speech", str(REAL_SPEECH)]) == 0
    out = capsys.readouterr().out
    (summary,) = [line for line in out.splitlines() if line.strip().startswith("CER at 640 ms:")]
    recording, real = (float(part.split()[-2]) for part in summary.split(":", 1)[1].split(","))
    assert recording < 20.0 and real > 80.0, summary  # hears its own kind of voice, not a person's
    assert sum(" CER " in line and "[reference: " in line for line in out.splitlines()) == 6
    note = " ".join(out[out.index("  NOTE: ") :].split())  # wrapped at 100 columns
    assert note.startswith("NOTE: This is the bundled demo model") and "will not understand a person" in note
    assert "asr-model pull NAME" in note and "asr-model install ARCHIVE" in note


def test_the_demo_model_is_known_by_its_marker_not_its_path(tmp_path: Path) -> None:
    assert is_demo_model(DEMO_MODEL_DIR)
    copy = tmp_path / "copy"
    copy.mkdir()
    assert not is_demo_model(copy)
    (copy / "DEMO").write_text("synthetic-voices-only\n")
    assert is_demo_model(copy)


def test_without_real_recordings_the_check_says_it_skipped_them_and_how_to_give_some(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = tmp_path / "absent"
    assert check.real_speech_candidates({"ASR_REAL_SPEECH": str(absent)}, cwd=tmp_path)[0] == absent
    monkeypatch.setattr(check, "real_speech_candidates", lambda: [absent])
    assert main(["check", str(DEMO_MODEL_DIR), "--chunk-ms", "640"]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("real speech:")]
    assert line.startswith(f"real speech: skipped: no real recordings found (looked in {absent})")
    assert "--real-speech DIR" in line and "CER 0.0 %" in out
