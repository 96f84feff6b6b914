"""``asr-transcribe`` end to end on the golden fixture's WAVs (tokens, scores and dumped arrays
against WeNet's), and its handling of bad inputs (exit 2, one line on stderr)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from asr_core.cli_transcribe import main
from asr_core.tokens import tokens_to_text

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(
    not (FIXTURE / "decoding.json").exists(), reason=f"golden fixture not found at {FIXTURE}"
)
UTTS = ("utt1", "utt2")
SETTINGS = {"full": ["--chunk-ms", "full"], "stream_c8_l-1": ["--chunk-ms", "320", "--left-chunks", "-1"]}


def score_ok(a: float, b: float) -> bool:
    return abs(a - b) <= max(1e-3, 1e-5 * abs(b))


def visible(wenet_text: str) -> str:
    """WeNet's detokenizer keeps <unk>; asr-transcribe drops it."""
    return wenet_text.replace("<unk>", "")


@pytest.fixture(scope="module")
def decoding() -> dict[str, Any]:
    with open(FIXTURE / "decoding.json", encoding="utf-8") as f:
        result: dict[str, Any] = json.load(f)
    return result


@pytest.fixture(scope="module")
def expected_arrays() -> Any:
    return np.load(FIXTURE / "expected.npz")


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]], str]:
    torch.set_num_threads(1)
    wavs = [str(FIXTURE / "wav" / f"{utt}.wav") for utt in UTTS]
    code = main([*wavs, "--model", str(FIXTURE / "model"), "--json", *args])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_and_prefix_beam_tokens(
    capsys: pytest.CaptureFixture[str], setting: str, decoding: dict[str, Any]
) -> None:
    code, greedy, _ = run_cli(capsys, *SETTINGS[setting], "--mode", "greedy")
    assert code == 0
    code, beam, _ = run_cli(capsys, *SETTINGS[setting], "--mode", "prefix_beam")
    assert code == 0
    for utt, g, b in zip(UTTS, greedy, beam, strict=True):
        expected = decoding[utt][setting]
        assert g["tokens"] == expected["ctc_greedy_search"]["tokens"]
        assert g["text"] == visible(expected["ctc_greedy_search"]["text"])
        assert (g["mode"], g["left_chunks"]) == ("greedy", -1)
        ref = expected["ctc_prefix_beam_search"]
        assert [e["tokens"] for e in b["nbest"]] == ref["nbest"]
        assert [e["text"] for e in b["nbest"]] == [visible(t) for t in ref["nbest_text"]]
        for entry, score in zip(b["nbest"], ref["nbest_scores"], strict=True):
            assert score_ok(entry["score"], score)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_rescore_and_dumped_arrays(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setting: str, decoding: dict[str, Any], expected_arrays: Any
) -> None:
    dump = tmp_path / "dump.npz"
    code, results, _ = run_cli(capsys, *SETTINGS[setting], "--mode", "rescore", "--dump-npz", str(dump))
    assert code == 0
    arrays = np.load(dump)
    for utt, result in zip(UTTS, results, strict=True):
        expected = decoding[utt][setting]
        winner = expected["attention_rescoring"]
        assert result["tokens"] == winner["tokens"]
        assert result["text"] == visible(winner["text"])
        assert result["chunk_ms"] == ("full" if setting == "full" else 320)
        assert score_ok(result["nbest"][0]["score"], winner["score"])
        by_tokens = {tuple(e["tokens"]): e for e in result["nbest"]}
        for ref in expected["per_hypothesis"]:
            got = by_tokens[tuple(ref["tokens"])]
            assert score_ok(got["ctc_score"], ref["ctc_prefix_score"])
            assert score_ok(got["l2r_score"], ref["l2r_decoder_score"])
            assert score_ok(got["r2l_score"], ref["r2l_decoder_score"])
            assert score_ok(got["score"], ref["final_score"])

        fbank = np.abs(arrays[f"{utt}__fbank"] - expected_arrays[f"{utt}__fbank"])
        assert fbank.max() <= 2e-2 and fbank.mean() <= 1e-4
        enc = arrays[f"{utt}__encoder_out_{setting}"]
        assert np.abs(enc - expected_arrays[f"{utt}__encoder_out_{setting}"]).max() <= 1e-3
        if f"{utt}__ctc_logprobs_{setting}" in expected_arrays:
            ctc = arrays[f"{utt}__ctc_logprobs_{setting}"]
            assert np.abs(ctc - expected_arrays[f"{utt}__ctc_logprobs_{setting}"]).max() <= 5e-3
        for direction in ("l2r", "r2l"):
            key = f"{utt}__decoder_logprobs_{direction}_{setting}"
            got_lp, ref_lp = arrays[key], expected_arrays[key]
            assert got_lp.shape == ref_lp.shape
            for i, tokens in enumerate(expected["ctc_prefix_beam_search"]["nbest"]):
                valid = len(tokens) + 1
                assert np.abs(got_lp[i, :valid] - ref_lp[i, :valid]).max() <= 5e-3


def test_streaming_with_limited_left_chunks_dumps_fixture_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, expected_arrays: Any
) -> None:
    dump = tmp_path / "dump.npz"
    code, results, _ = run_cli(
        capsys, "--chunk-ms", "160", "--left-chunks", "2", "--mode", "greedy", "--dump-npz", str(dump)
    )
    assert code == 0 and [r["chunk_ms"] for r in results] == [160, 160]
    arrays = np.load(dump)
    for utt in UTTS:
        for name, tol in (("encoder_out_stream_c4_l2", 1e-3), ("ctc_logprobs_stream_c4_l2", 5e-3)):
            assert np.abs(arrays[f"{utt}__{name}"] - expected_arrays[f"{utt}__{name}"]).max() <= tol


def test_plain_output_and_8k_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with wave.open(str(FIXTURE / "wav" / "utt1.wav"), "rb") as src:
        samples = np.frombuffer(src.readframes(src.getnframes()), dtype="<i2")
    narrow = tmp_path / "narrow.wav"
    with wave.open(str(narrow), "wb") as dst:
        dst.setnchannels(1)
        dst.setsampwidth(2)
        dst.setframerate(8000)
        dst.writeframes(samples[::2].tobytes())
    code = main([str(narrow), "--model", str(FIXTURE / "model"), "--mode", "greedy"])
    out, err = capsys.readouterr()
    assert code == 0
    name, text = out.rstrip("\n").split("\t")
    assert name == str(narrow) and text
    assert "resampled from 8000 Hz" in err


def test_text_joins_units_and_drops_specials() -> None:
    units = ["<blank>", "<unk>", "\u2581HELLO", "\u2581WOR", "LD", "你", "<sos/eos>"]
    assert tokens_to_text([2, 3, 4, 1, 5, 6, 0], units) == "HELLO WORLD你"


# --- bad inputs ---


def _bad_model_dir(tmp_path: Path, problem: str) -> Path:
    model = tmp_path / f"model_{problem}"
    shutil.copytree(FIXTURE / "model", model)
    os.chmod(model, 0o755)
    for f in model.iterdir():
        os.chmod(f, 0o644)
    if problem == "missing_file":
        (model / "units.txt").unlink()
    else:
        config = yaml.safe_load((model / "train.yaml").read_text(encoding="utf-8"))
        config["encoder_conf"]["linear_units"] = 512
        (model / "train.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return model


def _write(path: Path, rate: int = 16000, channels: int = 1, frames: int = 4000) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.zeros(frames * channels, dtype=np.int16).tobytes())
    return path


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("missing_wav", "no such file"),
        ("empty_wav", "empty"),
        ("truncated_wav", "truncated"),
        ("stereo_wav", "mono"),
        ("rate_wav", "22050 Hz"),
        ("not_wav", "not a readable"),
        ("missing_file", "missing units.txt"),
        ("shape_mismatch", "shape mismatch"),
        ("no_model_dir", "missing train.yaml"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str, words: str
) -> None:
    model = FIXTURE / "model"
    wav = FIXTURE / "wav" / "utt1.wav"
    if case == "missing_wav":
        wav = tmp_path / "absent.wav"
    elif case == "empty_wav":
        wav = _write(tmp_path / "empty.wav", frames=0)
    elif case == "truncated_wav":
        wav = tmp_path / "cut.wav"
        wav.write_bytes(_write(tmp_path / "full.wav").read_bytes()[:3000])
    elif case == "stereo_wav":
        wav = _write(tmp_path / "stereo.wav", channels=2)
    elif case == "rate_wav":
        wav = _write(tmp_path / "rate.wav", rate=22050)
    elif case == "not_wav":
        wav = tmp_path / "text.wav"
        wav.write_text("hello\n", encoding="utf-8")
    elif case == "no_model_dir":
        model = tmp_path / "nowhere"
    else:
        model = _bad_model_dir(tmp_path, case)
    code = main([str(wav), "--model", str(model)])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert words in lines[0]
    assert "Traceback" not in err


def test_bad_option_values(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--left-chunks", "0"], ["--chunk-ms", "100"], ["--beam", "0"], ["--device", "tpu9"]):
        with pytest.raises(SystemExit) as info:
            main([str(FIXTURE / "wav" / "utt1.wav"), "--model", str(FIXTURE / "model"), *args])
        assert info.value.code == 2
    capsys.readouterr()


def test_model_dir_from_environment(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    wav = str(FIXTURE / "wav" / "utt1.wav")
    monkeypatch.setenv("ASR_MODEL_DIR", str(FIXTURE / "model"))
    assert main([wav, "--mode", "greedy"]) == 0
    monkeypatch.delenv("ASR_MODEL_DIR")
    monkeypatch.setattr("asr_core.cli_transcribe.DEMO_MODEL_DIR", FIXTURE / "absent_demo_model")
    assert main([wav, "--mode", "greedy"]) == 2
    out, err = capsys.readouterr()
    assert out.startswith(wav + "\t")
    assert "no model: pass --model DIR or set ASR_MODEL_DIR" in err


def test_no_traceback_in_a_real_process(tmp_path: Path) -> None:
    """The console entry point: a bad model dir gives exit 2 and one line; --debug adds the traceback."""
    model = _bad_model_dir(tmp_path, "shape_mismatch")
    cmd = [sys.executable, "-m", "asr_core.cli_transcribe", str(FIXTURE / "wav" / "utt1.wav"), "--model", str(model)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert plain.returncode == 2
    assert plain.stdout == ""
    assert len(plain.stderr.strip().splitlines()) == 1
    assert "Traceback" not in plain.stderr
    debug = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, timeout=120, env=env)
    assert debug.returncode == 2
    assert "Traceback" in debug.stderr
