"""``asr-bench accuracy`` on the layouts users have: a Kaldi data directory (with segments),
WeNet's data.list, 8 and 16 kHz audio; worst utterances aligned; an A/B in one run."""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr

from asr_common.scoring import align, edit_distance, marked_diff
from asr_core.audio_io import read_pcm16
from deploy.bench import accuracy, accuracy_report
from deploy.bench.datasets import DataSetError, load_dataset
from tests.demo_quality import DEMO_MODEL

BUNDLE = Path(__file__).resolve().parent / "data" / "hotline_8k"
TEXTS = dict(line.split(" ", 1) for line in (BUNDLE / "text").read_text(encoding="utf-8").splitlines() if line.strip())


def _write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(samples.astype("<i2").tobytes())


def _kaldi_dir(root: Path) -> Path:
    """hotline_seed and hotline_1 as segments of one 8 kHz recording (0.5 s apart), hotline_2
    as its own 16 kHz file; relative paths in wav.scp, resolved from the directory."""
    data = root / "kaldi"
    data.mkdir()
    seed, rate = read_pcm16(BUNDLE / "hotline_seed.wav")
    one, _ = read_pcm16(BUNDLE / "hotline_1.wav")
    gap = np.zeros(rate // 2, np.int16)
    _write_wav(data / "both.wav", np.concatenate([seed, gap, one]), rate)
    two, rate_two = read_pcm16(BUNDLE / "hotline_2.wav")
    wideband = soxr.resample(two.astype(np.float32), rate_two, 16000)
    _write_wav(data / "two_16k.wav", np.clip(np.rint(wideband), -32768, 32767), 16000)
    (data / "wav.scp").write_text("both both.wav\ntwo two_16k.wav\n", encoding="utf-8")
    end_seed = len(seed) / rate
    (data / "segments").write_text(
        f"hotline_seed both 0 {end_seed}\n"
        f"hotline_1 both {end_seed + 0.5} {end_seed + 0.5 + len(one) / rate}\n"
        "hotline_2 two 0 100\n",
        encoding="utf-8",
    )
    names = ("hotline_seed", "hotline_1", "hotline_2")
    (data / "text").write_text("".join(f"{n} {TEXTS[n]}\n" for n in names), encoding="utf-8")
    return data


def test_align_marks_the_edits_and_agrees_with_edit_distance() -> None:
    pairs = [("井盖发生了破损", "井盖破损了"), ("", "abc"), ("新华路十二号", "新华路12号"), ("kitten", "sitting")]
    for ref, hyp in pairs:
        edits = align(ref, hyp)
        assert sum(e.op != "=" for e in edits) == edit_distance(ref, hyp)
        assert "".join(e.ref for e in edits) == ref and "".join(e.hyp for e in edits) == hyp
    assert marked_diff(align("新华路十二号", "新华路12号")) == "新华路[十二→12]号"
    assert marked_diff(align("早上七点多北京路", "早上七点北京路附近")) == "早上七点[-多]北京路[+附近]"


def test_layouts_are_read_with_segments_and_clear_errors(tmp_path: Path) -> None:
    data = _kaldi_dir(tmp_path)
    testset = load_dataset(data)
    assert testset.layout == "kaldi" and [u.utt_id for u in testset.utterances] == [
        "hotline_seed",
        "hotline_1",
        "hotline_2",
    ]
    items = accuracy.read_audio(data)  # 16 kHz model rate
    whole = {utt: audio for utt, _, audio in accuracy.read_audio(BUNDLE)}
    for utt, text, audio in items:
        assert text == TEXTS[utt].strip() and abs(len(audio) - len(whole[utt])) <= 2
    listed = tmp_path / "data.list"
    listed.write_text(
        "".join(
            json.dumps({"key": n, "wav": str(BUNDLE / f"{n}.wav"), "txt": TEXTS[n].strip()}, ensure_ascii=False) + "\n"
            for n in ("hotline_3", "hotline_1")
        ),
        encoding="utf-8",
    )
    assert [u.utt_id for u in load_dataset(listed).utterances] == ["hotline_3", "hotline_1"]
    (data / "wav.scp").write_text("both sox both.wav -t wav - |\ntwo two_16k.wav\n", encoding="utf-8")
    with pytest.raises(DataSetError, match=r"a command .* is not run"):
        load_dataset(data)
    listed.write_text('{"key": "a", "wav": "a.wav"}\n', encoding="utf-8")
    with pytest.raises(DataSetError, match=r"data.list:1: expected"):
        load_dataset(listed)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataSetError, match=r"holds neither wav\.scp"):
        load_dataset(tmp_path / "empty")


def test_cli_reports_each_set_with_worst_utterances_and_an_ab(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _kaldi_dir(tmp_path)
    listed = tmp_path / "calls.list"
    listed.write_text(
        json.dumps({"key": "hotline_3", "wav": str(BUNDLE / "hotline_3.wav"), "txt": TEXTS["hotline_3"]}) + "\n",
        encoding="utf-8",
    )
    common = ["--model", str(DEMO_MODEL), "--chunk-ms", "320", "--attention-beam", "0", "--beam", "4"]
    accuracy.main([*common, "--testset", str(data), str(listed), "--worst", "2"])
    sets = json.loads(capsys.readouterr().out)["sets"]
    assert [s["utterances"] for s in sets] == [3, 1]
    kaldi = sets[0]
    assert set(kaldi["cer"]) == {"320ms"} and {"greedy", "rescore"} <= set(kaldi["cer"]["320ms"])
    worst = kaldi["worst"]["320ms"]
    assert worst["method"] == "rescore" and len(worst["utterances"]) <= 2
    for row in worst["utterances"]:
        assert row["errors"] > 0 and len(row["ref"]) == len(row["hyp"])
        assert row["ref"].replace("＊", "") == TEXTS[row["id"]].strip()

    accuracy.main([*common, "--testset", str(data), "--compare", "chunk_ms=160,640"])
    report = json.loads(capsys.readouterr().out)
    assert report["compare"] == "chunk_ms"
    assert [list(v["cer"]) for v in report["variants"]] == [["160ms"], ["640ms"]]
    for row in report["changed"]:
        assert set(row) == {"id", "ref", "160", "640"}

    with pytest.raises(SystemExit):
        accuracy.main([*common, "--testset", str(data), "--compare", "chunk_ms=160"])
    assert "give two or more values" in capsys.readouterr().err


def test_finals_worse_than_partials_are_warned() -> None:
    assert accuracy_report.finals_warning("160ms", {"greedy": 0.59, "joint": 0.77}) is not None
    assert "attention_beam" in (accuracy_report.finals_warning("160ms", {"greedy": 0.59, "joint": 0.77}) or "")
    assert accuracy_report.finals_warning("160ms", {"greedy": 0.59, "rescore": 0.58}) is None
    assert accuracy_report.finals_warning("160ms", {"greedy": 0.59}) is None


def test_compare_hotwords_and_itn_apply_to_every_decode(tmp_path: Path) -> None:
    streets = tmp_path / "streets.txt"
    streets.write_text("新华路\n北京路\n", encoding="utf-8")
    common: dict[str, Any] = {"chunk_ms": (320,), "beam": 4, "limit": 2}
    report = accuracy.compare(DEMO_MODEL, BUNDLE, "hotwords", ["off", str(streets)], **common)
    both = accuracy.evaluate(DEMO_MODEL, BUNDLE, hotwords=streets, **common)["hotwords"]["320ms"]
    off, on = (variant["cer"]["320ms"]["rescore"] for variant in report["variants"])
    assert (off, on) == (both["without"]["rescore"]["cer"], both["with"]["rescore"]["cer"])
    report = accuracy.compare(DEMO_MODEL, BUNDLE, "itn", ["off", "on"], **common)
    assert [v.get("itn_on_finals", False) for v in report["variants"]] == [False, True]
    for row in report["changed"]:  # ITN only rewrites numbers: 十二号 -> 12号
        assert any(ch.isdigit() for ch in row["on"]["hyp"])
