"""``asr-bench accuracy --hotwords FILE --itn``: name recall without and with a route's list in
one run, ITN exact match per numeric class, and the test sets they run on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asr_common.scoring import name_hits
from asr_core.context_graph import load_phrases
from asr_core.model.loader import load_units
from deploy.bench import accuracy
from recipes import textgen
from tests.demo_quality import DEMO_MODEL

REPO = Path(__file__).resolve().parents[1]
TESTSETS = REPO / "recipes" / "testsets"
BUNDLE = REPO / "tests" / "data" / "hotline_8k"


def test_name_hits_count_each_said_name_once() -> None:
    refs = ["我住在金沙江路八号", "秦淮区和秦淮区"]
    hyps = ["我住在锦江路八号", "秦淮区，金沙江路"]
    # said: 金沙江路 once, 秦淮区 twice; heard right: 秦淮区 once; added: 金沙江路 where not said
    assert name_hits(hyps, refs, ["金沙江路", "秦淮区"]) == (1, 3, 1)
    assert name_hits(refs, refs, ["金沙江路", "秦淮区", "北京路"]) == (3, 3, 0)


def test_itn_scores_per_class_and_lists_what_it_gets_wrong(tmp_path: Path) -> None:
    path = tmp_path / "itn.tsv"
    path.write_text("# comment\nhouse\t新华路十二号\t新华路12号\ntime\t凌晨两点\t凌晨2点\ntime\t晚上十点\t晚上10点\n")
    report = accuracy.itn_accuracy(path)
    assert report["cases"] == 3 and report["exact_match"] == round(2 / 3, 4)
    assert report["classes"]["house"]["exact_match"] == 1.0
    time_class = report["classes"]["time"]
    assert time_class["exact_match"] == 0.5
    assert time_class["wrong"] == [{"spoken": "凌晨两点", "expected": "凌晨2点", "got": "凌晨两点"}]
    path.write_text("house\t新华路十二号\n")
    with pytest.raises(ValueError, match=r"itn.tsv:1: expected 'class<TAB>spoken<TAB>expected'"):
        accuracy.itn_accuracy(path)


def test_the_repos_sets_are_usable() -> None:
    units = set(load_units(DEMO_MODEL / "units.txt"))
    names = [p.text for p in load_phrases(TESTSETS / "names_hotwords.txt")]
    lines = [line for line in (TESTSETS / "names.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    assert 60 <= len(lines) <= 100 and len(set(lines)) == len(lines)
    assert {ch for line in lines for ch in textgen.strip_punctuation(line)} <= units
    assert all(any(name in line for name in names) for line in lines)
    assert all(any(name in line for line in lines) for name in names)
    # Rare in training: none is one of the recipe's place words.
    recipe_words = set(textgen.ROADS) | set(textgen.COMMUNITIES)
    lexicon = (REPO / "recipes" / "lexicon.tsv").read_text(encoding="utf-8")
    assert not [name for name in names if name in recipe_words or name in lexicon]
    classes = accuracy.itn_accuracy(accuracy.ITN_SET)["classes"]
    assert {"house", "time", "date", "phone", "money"} <= set(classes)
    assert all(entry["cases"] >= 5 for entry in classes.values())


def test_cli_itn_alone_and_clear_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    accuracy.main(["--itn"])
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"itn"} and report["itn"]["cases"] >= 40
    with pytest.raises(SystemExit) as exited:
        accuracy.main(["--model", str(DEMO_MODEL)])
    assert exited.value.code == 2 and "give --model and --testset" in capsys.readouterr().err
    bad = tmp_path / "streets.txt"
    bad.write_text("新华路 :x\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        accuracy.main(["--model", str(DEMO_MODEL), "--testset", str(BUNDLE), "--hotwords", str(bad)])
    assert exited.value.code == 2 and "streets.txt:1: boost 'x' is not a number" in capsys.readouterr().err


def test_name_recall_without_and_with_the_list_in_one_run(tmp_path: Path) -> None:
    streets = tmp_path / "streets.txt"
    streets.write_text("新华路\n北京路\n", encoding="utf-8")
    report = accuracy.evaluate(DEMO_MODEL, BUNDLE, chunk_ms=(320,), hotwords=streets, attention_beam=4)
    hot = report["hotwords"]
    assert hot["phrases"] == 2 and hot["names_in_references"] == 3
    without, with_list = hot["320ms"]["without"], hot["320ms"]["with"]
    assert set(without) == set(with_list) == {"greedy", "rescore", "joint"}
    assert without["greedy"] == with_list["greedy"]  # partials are not biased
    assert without["joint"]["cer"] == report["cer"]["320ms"]["joint"]
    for method in ("rescore", "joint"):
        assert with_list[method]["names_recognized"] >= without[method]["names_recognized"]
        assert 0.0 <= with_list[method]["name_recall"] <= 1.0
