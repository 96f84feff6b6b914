"""``asr-gateway demo`` end to end (real sipp, redis-server and service), and its clear failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from asr_gateway.cli import main as cli_main
from asr_gateway.dev.demo import DATA_DIR, DEMO_CALLS, load_references
from asr_gateway.service import DEMO_MODEL_DIR
from tests.demo_quality import GOOD_ENOUGH_CER
from tests.tool_marks import needs_redis_server, needs_sipp

MODEL = DEMO_MODEL_DIR  # the bundled model must read the bundled recordings: no fallback, no skip


def test_bundled_audio_is_small_and_has_references() -> None:
    references = load_references()
    total = sum(path.stat().st_size for path in DATA_DIR.iterdir())
    assert total <= 400 * 1024
    for call in DEMO_CALLS:
        for name in filter(None, (call.wav, call.second_wav)):
            assert (DATA_DIR / f"{name}.wav").is_file()
            assert name in references
    assert {call.codec for call in DEMO_CALLS} == {"PCMU", "PCMA"}
    assert any(call.siprec for call in DEMO_CALLS)


@needs_sipp
@needs_redis_server
def test_demo_runs_the_whole_pipeline(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASR_REDIS_URL", raising=False)
    code = cli_main(["demo", "--model", str(MODEL), "--json"])
    out = capsys.readouterr().out
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0, report
    assert report["ok"]
    assert len(report["calls"]) == len(DEMO_CALLS)
    for call, expected in zip(report["calls"], DEMO_CALLS, strict=True):
        assert call["sipp_ok"] and call["ended_reason"] == "bye", call
        assert call["codec"] == expected.codec
        assert call["first_partial_ms"] is not None
        for leg in call["legs"]:
            assert leg["text"], "every leg has a final transcript"
            assert leg["cer"] is not None
    siprec = next(call for call in report["calls"] if call["siprec"])
    assert sorted(siprec["roles"]) == ["agent", "caller"]
    assert sorted(leg["role"] for leg in siprec["legs"]) == ["agent", "caller"], "both SIPREC legs carry audio"
    for call in report["calls"]:
        assert max(leg["cer"] for leg in call["legs"]) <= GOOD_ENOUGH_CER, call
    manhole = report["calls"][0]
    assert any("kb-municipal-manhole" in kb for kb in manhole["kb"]), manhole
    assert any(tag.startswith("市政设施/井盖") for tag in manhole["tags"]), manhole


def test_demo_without_sipp_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    code = cli_main(["demo", "--model", str(MODEL)])
    assert code == 2
    assert "sip-tester" in capsys.readouterr().err


def test_demo_without_a_model_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if shutil.which("sipp") is None:
        pytest.skip("sipp not installed")
    code = cli_main(["demo", "--model", str(tmp_path)])
    assert code == 2
    assert "final.pt" in capsys.readouterr().err


def test_demo_without_redis_server_says_what_to_do(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sipp = shutil.which("sipp")
    if sipp is None:
        pytest.skip("needs sipp")
    (tmp_path / "sipp").symlink_to(sipp)
    monkeypatch.setenv("PATH", str(tmp_path))
    code = cli_main(["demo", "--model", str(MODEL), "--redis", "redis://127.0.0.1:1/0"])
    assert code == 2
    err = capsys.readouterr().err
    assert "does not answer" in err and "redis-server not found" in err
