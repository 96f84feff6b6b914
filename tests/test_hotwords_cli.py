"""``asr-transcribe --hotwords`` on the golden fixture: a boosted phrase wins the CTC search and
keeps winning through attention rescoring; bad phrase files exit 2 naming file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr_core.tokens import text_to_tokens
from tests.test_transcribe_cli import SETTINGS, run_cli

pytestmark = pytest.mark.skipif(
    not (Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small").exists(),
    reason="golden fixture not found",
)


def test_text_to_tokens_spells_characters_and_bpe_words() -> None:
    units = ["<blank>", "<unk>", "新", "华", "路", "\u2581HE", "LLO", "\u2581HELLO", "\u2581W", "ORLD"]
    assert text_to_tokens("新华路", units[:5]) == [2, 3, 4]
    assert text_to_tokens("新 华", units[:5]) == [2, 3]
    assert text_to_tokens("新X", units[:5]) is None
    assert text_to_tokens("HELLO WORLD", units) == [7, 8, 9]


@pytest.mark.parametrize("mode", ["prefix_beam", "rescore", "joint"])
def test_a_boosted_runner_up_gains_its_bonus(capsys: pytest.CaptureFixture[str], tmp_path: Path, mode: str) -> None:
    """The CTC search's runner-up, boosted, wins the search; rescoring and the joint finals add
    the same bonus (3.0 per token) to its final score, so they do not undo it."""
    code, plain, _ = run_cli(capsys, *SETTINGS["full"], "--mode", "prefix_beam")
    assert code == 0
    phrase = plain[0]["nbest"][1]["text"]
    assert phrase != plain[0]["text"]
    hotwords = tmp_path / "hw.txt"
    hotwords.write_text(f"# runner-up\n{phrase} :3.0\n", encoding="utf-8")
    code, biased, _ = run_cli(capsys, *SETTINGS["full"], "--mode", mode, "--hotwords", str(hotwords))
    assert code == 0
    code, unbiased, _ = run_cli(capsys, *SETTINGS["full"], "--mode", mode)
    if mode == "prefix_beam":
        assert biased[0]["text"] == phrase
        return
    before = next(e for e in unbiased[0]["nbest"] if e["text"] == phrase)
    after = next(e for e in biased[0]["nbest"] if e["text"] == phrase)
    # final = 0.7 l2r + 0.3 r2l + 0.5 ctc (the defaults) + the bonus. The CTC prefix score itself
    # may grow a little: with the bonus more of the phrase's alignments stay in the beam.
    decoder = 0.7 * after["l2r_score"] + 0.3 * after["r2l_score"]
    bonus = 3.0 * len(after["tokens"])
    assert after["score"] == pytest.approx(decoder + 0.5 * after["ctc_score"] + bonus, abs=1e-4)
    assert biased[0]["nbest"].index(after) < unbiased[0]["nbest"].index(before)


def test_bad_phrase_files_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    hotwords = tmp_path / "hw.txt"
    hotwords.write_text("新华路 :lots\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "--hotwords", str(hotwords))
    assert code == 2 and "hw.txt:1: boost 'lots'" in err
    hotwords.write_text("我\n\u263a\u263a\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "--hotwords", str(hotwords))
    assert code == 2 and "hw.txt:2:" in err and "no unit" in err


def test_itn_flag_keeps_the_spoken_form(capsys: pytest.CaptureFixture[str]) -> None:
    from asr_common.itn import normalize_numbers

    code, results, _ = run_cli(capsys, *SETTINGS["full"], "--mode", "prefix_beam", "--itn")
    assert code == 0
    for result in results:
        assert result["text_raw"] == result["nbest"][0]["text_raw"]
        assert result["text"] == normalize_numbers(result["text_raw"]).text
        assert all(e["text"] == normalize_numbers(e["text_raw"]).text for e in result["nbest"])
