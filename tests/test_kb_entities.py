"""Entities (phone, ID with GB 11643 checksum, address, date, time) and redaction modes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kb_hooks.entities import digit_runs, extract_entities, id_checksum_ok, number_entities
from kb_hooks.normalize import DIGIT_CHARS
from kb_hooks.redact import SENSITIVE_LABELS, Redactor
from kb_hooks.types import RedactionMode

TESTSETS = Path(__file__).resolve().parents[1] / "recipes" / "testsets"
VALID_ID = "11010519491231002X"  # the standard's worked example
SPOKEN = "幺幺零幺零五幺九四九幺二三幺零零二叉"  # the same number read aloud


def labels(text: str) -> list[tuple[str, str]]:
    return [(e.label, e.value) for e in extract_entities(text)]


def make_id(body: str) -> str:
    weights = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
    return body + "10X98765432"[sum(int(d) * w for d, w in zip(body, weights, strict=True)) % 11]


def test_id_checksum() -> None:
    assert id_checksum_ok(VALID_ID) and id_checksum_ok(VALID_ID.lower())
    assert not id_checksum_ok("110105194912310021")
    assert not id_checksum_ok("11010519491231002")
    assert labels(f"身份证号{SPOKEN}") == [("id_number", SPOKEN)]
    assert [e.normalized for e in extract_entities(f"身份证{SPOKEN}")] == [VALID_ID]
    assert labels("身份证110105194912310021") == []  # wrong check digit is not an ID


@given(st.text(alphabet="0123456789", min_size=17, max_size=17), st.integers(0, 16), st.integers(1, 9))
def test_any_single_digit_error_breaks_the_checksum(body: str, position: int, delta: int) -> None:
    number = make_id(body)
    assert id_checksum_ok(number)
    broken = number[:position] + str((int(number[position]) + delta) % 10) + number[position + 1 :]
    assert not id_checksum_ok(broken)


def test_phone_numbers_spoken_and_written() -> None:
    assert labels("我的手机是幺三八零零一三八零零零") == [("phone", "幺三八零零一三八零零零")]
    assert labels("打13800138000找我") == [("phone", "13800138000")]
    assert labels("座机零幺零 六二五五 八八八八") == [("phone", "零幺零 六二五五 八八八八")]
    assert labels("电话八八六六五五四四") == [("phone", "八八六六五五四四")]
    assert labels("一共八八六六五五四四元") == []  # 8 digits without a cue word are not a phone


def test_addresses_dates_times() -> None:
    assert ("address", "新华路十二号") in labels("我今天发现新华路十二号井盖发生了破损")
    assert ("address", "和平路3号院2号楼") in labels("我家住在和平路3号院2号楼")
    assert ("address", "阳光小区5栋") in labels("阳光小区5栋停水了")


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("你好，我要投诉人民大道一百三十号夜间施工噪音扰民", "人民大道一百三十号"),
        ("喂，你好，我要反映解放大街一百四十四号的路灯不亮", "解放大街一百四十四号"),
        ("我想反映一下和平路一百二十四号家里没有水了", "和平路一百二十四号"),
        ("你好，那个，我们中山东路三十七号家里没有水了", "中山东路三十七号"),
        ("咱们小区阳光花园5栋停水了", "阳光花园5栋"),
        ("我来举报北京路76号违章搭建", "北京路76号"),
    ],
)
def test_an_address_starts_after_the_verb_or_pronoun_before_it(text: str, address: str) -> None:
    assert [v for label, v in labels(text) if label == "address"] == [address]


def test_a_kind_of_place_without_a_name_is_no_address() -> None:
    assert [v for label, v in labels("我要投诉大道3号，咱们小区") if label == "address"] == []
    assert labels("三月十二号下午三点半") == [("date", "三月十二号"), ("time", "下午三点半")]
    assert labels("明天上午10:30来") == [("date", "明天"), ("time", "10:30")]
    assert labels("快一点") == []


def test_redaction_modes() -> None:
    text = f"电话幺三八零零一三八零零零，身份证{VALID_ID}"
    entities = extract_entities(text)
    redactor = Redactor(b"key")
    masked = redactor.redact(text, entities, RedactionMode.MASK)
    assert masked.text == "电话" + "*" * 11 + "，身份证" + "*" * 18
    assert masked.map_offset(20) == 20  # same length

    kept = redactor.redact(text, entities, RedactionMode.KEEP)
    assert kept.text == text

    hashed = redactor.redact(text, entities, RedactionMode.HASH)
    phone_token = redactor.published_value(entities[0], RedactionMode.HASH)
    assert phone_token.startswith("[phone:") and len(phone_token) == len("[phone:]") + 12
    assert hashed.text.startswith("电话" + phone_token + "，身份证[id_number:")
    # the same number spoken or written hashes alike; another key gives another hash
    written = extract_entities("电话13800138000")[0]
    assert redactor.published_value(written, RedactionMode.HASH) == phone_token
    assert Redactor(b"other").published_value(written, RedactionMode.HASH) != phone_token
    after = text.index("，")
    assert hashed.text[hashed.map_offset(after)] == "，"


def test_long_digit_runs_masked_in_partials() -> None:
    partial = "我的电话是一三八零零一三八零"  # 9 digits so far: not yet a phone number
    entities = extract_entities(partial, min_digit_run=7)
    assert [e.label for e in entities] == ["number"]
    assert Redactor().redact(partial, entities, RedactionMode.MASK).text == "我的电话是" + "*" * 9


def test_token_redaction_follows_text() -> None:
    text = "号码13800138000谢谢"
    redacted = Redactor().redact(text, extract_entities(text), RedactionMode.HASH)
    tokens = ["号", "码", "138", "0013", "8000", "谢", "谢"]
    assert Redactor.redact_tokens(text, tokens, redacted) == ["号", "码", "***", "****", "****", "谢", "谢"]


def hotline_texts() -> list[str]:
    """Hand-written hotline sentences and the work-order calls' turns (phones, IDs, addresses, times)."""
    texts = [line for name in ("free_hotline.txt", "punctuated_hotline.txt", "names.txt")
             for line in (TESTSETS / name).read_text(encoding="utf-8").splitlines() if line]  # fmt: skip
    calls = yaml.safe_load((TESTSETS / "workorder_calls.yaml").read_text(encoding="utf-8"))["calls"]
    texts += [text for call in calls for turn in call["turns"] for text in turn.values()]
    return texts + [f"身份证号{SPOKEN}", "电话13800138000", "我的电话是一三八零零一三八零", "号码 138 0013 8000"]


@pytest.mark.parametrize("min_digit_run", [0, 3, 7, 12])
def test_number_entities_are_what_redaction_takes_of_all_entities(min_digit_run: int) -> None:
    """Partials and n-best entries are redacted from ``number_entities`` alone: the same entities,
    so the same published text, as from ``extract_entities``."""
    texts = hotline_texts()
    assert len(texts) > 1000
    found = 0
    for text in texts:
        for prefix in (text, text[: len(text) // 2]):  # finals and partials
            sensitive = [e for e in extract_entities(prefix, min_digit_run) if e.label in SENSITIVE_LABELS]
            assert number_entities(prefix, min_digit_run) == sensitive, prefix
            found += bool(sensitive)
    assert found > 100


def _reference_digit_runs(text: str) -> list[tuple[str, list[int]]]:
    """``digit_runs`` as first written, every character read one by one: the oracle."""

    def digit(ch: str) -> str | None:
        if "0" <= ch <= "9":
            return ch
        if "０" <= ch <= "９":
            return chr(ord(ch) - ord("０") + ord("0"))
        return str(DIGIT_CHARS[ch]) if ch in DIGIT_CHARS else None

    runs: list[tuple[str, list[int]]] = []
    digits: list[str] = []
    where: list[int] = []
    for i in range(len(text) + 1):
        ch = text[i] if i < len(text) else ""
        d = digit(ch) if ch else None
        if d is None and ch in ("X", "x", "叉") and len(digits) == 17:
            d = "X"
        if d is not None:
            digits.append(d)
            where.append(i)
        elif not (ch in " -—_" and digits and i + 1 < len(text) and digit(text[i + 1]) is not None):
            if digits:
                runs.append(("".join(digits), where))
            digits, where = [], []
    return runs


RUN_ALPHABET = "0123456789０５９一二三四五六七八九零〇幺两Xx叉 -—_电话号是的十a"  # digits, X, separators, others


@given(st.text(alphabet=RUN_ALPHABET, max_size=60), st.integers(1, 20))
def test_digit_runs_read_only_the_stretches_that_can_hold_digits(text: str, min_digits: int) -> None:
    assert digit_runs(text) == _reference_digit_runs(text)
    assert digit_runs(text, min_digits) == [run for run in _reference_digit_runs(text) if len(run[0]) >= min_digits]


def test_digit_runs_on_hotline_text() -> None:
    for text in hotline_texts():
        assert digit_runs(text) == _reference_digit_runs(text), text
