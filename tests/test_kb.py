"""KB matching, tag rules, file loading with file:line errors, and atomic reloads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from asr_common.yamlconf import ConfigError
from kb_hooks.kb import KnowledgeBase, load_kb
from kb_hooks.normalize import normalize, numeral_to_digits
from kb_hooks.reload import ReloadableRef
from kb_hooks.tags import load_tag_rules

REPO = Path(__file__).resolve().parents[1]
KB_EXAMPLE = REPO / "deploy" / "config" / "kb.example.yaml"
TAGS_EXAMPLE = REPO / "deploy" / "config" / "tags.example.yaml"
SEED = "我今天发现新华路十二号井盖发生了破损，有安全隐患"


@pytest.fixture(scope="module")
def kb() -> KnowledgeBase:
    return load_kb(KB_EXAMPLE)


def test_normalization_folds_width_punctuation_and_numerals() -> None:
    norm = normalize("Ｗｉ－Ｆｉ， 新华路十二号 一三八")
    assert norm.text == "wifi新华路12号138"
    begin, end = norm.original_span(norm.text.index("12"), norm.text.index("12") + 2)
    assert "Ｗｉ－Ｆｉ， 新华路十二号 一三八"[begin:end] == "十二"
    assert [numeral_to_digits(x) for x in ("十二", "一百零三", "三千五", "幺三八", "两万")] == [
        "12", "103", "3500", "138", "20000"]  # fmt: skip


def test_seed_example_suggests_the_manhole_procedure(kb: KnowledgeBase) -> None:
    best = kb.match(SEED)[0]
    assert best.entry.title == "井盖破损应急处置流程"
    assert (best.kind, best.homophone) == ("all_of", False)
    assert SEED[best.begin : best.end] == "井盖发生了破损"


def test_homophone_match_scores_below_exact(kb: KnowledgeBase) -> None:
    exact = kb.match("井盖破损了")[0]
    homophone = kb.match("警盖破损了")[0]
    assert exact.entry.id == homophone.entry.id == "kb-municipal-manhole"
    assert not exact.homophone and homophone.homophone
    assert exact.score > homophone.score
    assert "警盖破损了"[homophone.begin : homophone.end] == "警盖破损"


def test_patterns_run_on_normalized_text(kb: KnowledgeBase) -> None:
    match = kb.match("晚上十一点，旁边还在施工")[0]
    assert match.entry.id == "kb-noise-construction" and match.kind == "pattern"


def test_priority_breaks_ties(tmp_path: Path) -> None:
    path = tmp_path / "kb.yaml"
    path.write_text(
        "entries:\n"
        "  - {id: low, title: 低, keywords: [停电], priority: 1}\n"
        "  - {id: high, title: 高, keywords: [停电], priority: 9}\n",
        encoding="utf-8",
    )
    assert [m.entry.id for m in load_kb(path).match("家里停电了")] == ["high", "low"]


def test_tag_rules_example() -> None:
    rules = load_tag_rules(TAGS_EXAMPLE)
    labels = {(t.kind, t.label, t.homophone) for t in rules.match(SEED)}
    assert ("demand", "市政设施/井盖", False) in labels
    assert {t.label for t in rules.match("我要投诉楼下广场舞太吵")} == {"投诉", "噪音扰民"}
    assert [(t.label, t.homophone) for t in rules.match("警盖没了")] == [("市政设施/井盖", True)]


def test_yaml_errors_name_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "kb.yaml"
    path.write_text(
        "entries:\n"
        "  - id: a\n"
        "    title: A\n"
        "    keywords: [井盖]\n"
        "    colour: red\n"
        "  - id: a\n"
        "    title: B\n"
        "    patterns: ['(unclosed']\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_kb(path)
    assert info.value.errors == [f"{path}:5 entries.0.colour: unknown key"]
    path.write_text(path.read_text(encoding="utf-8").replace("    colour: red\n", ""), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_kb(path)
    errors = info.value.errors
    assert errors[0].startswith(f"{path}:5 entries.1.id: duplicate id 'a'")
    assert errors[1].startswith(f"{path}:7 entries.1.patterns.0: invalid regular expression '(unclosed'")


def test_csv_kb_and_row_errors(tmp_path: Path) -> None:
    path = tmp_path / "kb.csv"
    path.write_text(
        "id,title,keywords,all_of,tags,priority\n"
        "manhole,井盖破损应急处置流程,井盖破损|井盖丢失,井盖|窨井盖;破损|坏了,市政设施/井盖,80\n"
        "water,停水报修,停水,,供水/停水,60\n",
        encoding="utf-8",
    )
    kb = load_kb(path)
    assert [m.entry.id for m in kb.match(SEED)] == ["manhole"]
    assert kb.entries[0].all_of == [["井盖", "窨井盖"], ["破损", "坏了"]]
    path.write_text(path.read_text(encoding="utf-8") + "bad,坏行,停电,,,high\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_kb(path)
    assert info.value.errors[0].startswith(f"{path}:4 (row 3) priority: 'high' is invalid")
    path.write_text("id,title,colour\nx,y,red\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"kb.csv:1 unknown column\(s\) colour"):
        load_kb(path)


def test_reload_applies_valid_change_and_keeps_previous_on_error(tmp_path: Path) -> None:
    path = tmp_path / "kb.yaml"
    shutil.copy(KB_EXAMPLE, path)
    ref = ReloadableRef(path, load_kb)
    first = ref.get()
    assert ref.try_reload().changed is False

    path.write_text(
        path.read_text(encoding="utf-8") + "  - {id: kb-power, title: 停电报修, keywords: [停电]}\n", encoding="utf-8"
    )
    result = ref.try_reload()
    assert result.ok and result.changed and ref.get() is not first
    assert ref.get().match("小区停电了")[0].entry.id == "kb-power"
    assert ref.content_hash == result.content_hash == ref.get().content_hash

    good = ref.get()
    path.write_text(path.read_text(encoding="utf-8") + "  - {id: broken, title: 坏, keywords: [x], pri: 1}\n",
                    encoding="utf-8")  # fmt: skip
    result = ref.try_reload()
    assert not result.ok and not result.changed
    assert result.errors == [f"{path}:{len(path.read_text(encoding='utf-8').splitlines())} entries.5.pri: unknown key"]
    assert ref.get() is good

    path.unlink()
    assert not ref.try_reload().ok and ref.get() is good


def test_tag_rules_reload_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "tags.yaml"
    path.write_text("rules:\n  - label: 停电\n    phrases: [停电]\n", encoding="utf-8")
    ref = ReloadableRef(path, load_tag_rules)
    path.write_text("rules:\n  - label: 停电\n    kind: wish\n", encoding="utf-8")
    result = ref.try_reload()
    assert not result.ok
    assert result.errors[0].startswith(f"{path}:3 rules.0.kind: 'wish' is invalid")
    assert len(ref.get()) == 1
