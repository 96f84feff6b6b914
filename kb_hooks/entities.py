"""Entity extraction from Mandarin transcripts: phone numbers, ID numbers, addresses, dates, times.

Numbers reach us spoken (一三八幺二..., 幺 for 1, 叉 for X) or written (138...); both are
read through one digit view of the text, so spans always point at the original characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from kb_hooks.normalize import DIGIT_CHARS, numeral_to_digits

EntityLabel = Literal["phone", "id_number", "address", "date", "time", "number"]

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
_SEPARATORS = frozenset(" -—_")
_SHORTEST_NUMBER = 7  # digits of the shortest number _is_phone takes (a local one after a cue word)
_PHONE_CUES = ("电话", "号码", "手机", "座机", "联系", "打")
_MOBILE = re.compile(r"1[3-9]\d{9}")
_LANDLINE = re.compile(r"0\d{9,11}")
_SERVICE = re.compile(r"[48]00\d{7}")

_NUM = "[0-9零〇一二三四五六七八九十百千幺两]"
_NUM_RUN = re.compile(f"{_NUM}+")  # compiled once: every address, date and time of a final goes through it
_HAN = "[\u4e00-\u9fff]"
_ROAD = re.compile(
    rf"(?P<name>{_HAN}{{1,6}}?(?P<kind>大道|大街|路|街|巷|弄|胡同))(?:{_NUM}+(?:段|巷|弄))?"
    rf"{_NUM}+号(?:(?:院|楼)?{_NUM}+(?:号楼|栋|幢|单元|室|楼))*"
)
_ESTATE = re.compile(
    rf"(?P<name>{_HAN}{{2,8}}?(?P<kind>小区|社区|花园|家园|新村|公寓|大厦|广场|苑))"
    rf"(?:{_NUM}+(?:号楼|栋|幢|期|区)(?:{_NUM}+(?:单元|室|楼|号))*)?"
)
# Words that end a sentence fragment before a place name: 我今天发现|新华路, 我家住在|和平路,
# 我要投诉|人民大道, 我想反映一下|和平路, 我们|中山东路 (the place starts after the last one).
_PLACE_BOUNDARIES = ("发现", "看到", "住在", "位于", "就是", "那边", "这边", "附近", "今天", "昨天", "我家",
                     "投诉", "反映", "举报", "报修", "报告", "咨询", "求助", "一下",
                     "我们", "咱们", "你们", "他们", "她们",
                     "在", "到", "是", "的", "了", "我", "你", "他", "她", "说", "去", "从", "往")  # fmt: skip
_DATE = re.compile(
    rf"(?:{_NUM}{{2,4}}年)?{_NUM}{{1,2}}月{_NUM}{{1,3}}(?:日|号)"
    r"|(?:大前天|前天|昨天|今天|明天|后天|大后天)"
    r"|(?:上个?|下个?|这个?|本)?(?:周|星期|礼拜)[一二三四五六日天1-7]"
)
_PERIOD = "(?:凌晨|早上|早晨|上午|中午|下午|傍晚|晚上|夜里|半夜)"
_TIME = re.compile(
    rf"(?P<period>{_PERIOD})?(?P<hour>{_NUM}{{1,3}})点(?P<rest>{_NUM}{{1,3}}分|半|一刻|三刻|钟|整)?"
    r"|\d{1,2}[:：]\d{2}"
)


@dataclass(frozen=True)
class Entity:
    """An entity found in an utterance; ``begin``/``end`` index the original text."""

    label: EntityLabel
    value: str  # the text as recognized
    normalized: str  # digits for numbers, numerals written as digits elsewhere
    begin: int
    end: int


def id_checksum_ok(number: str) -> bool:
    """GB 11643-1999 check: 17 digits, then the check character computed mod 11 ('X' for 10)."""
    if len(number) != 18 or not number[:17].isdigit():
        return False
    total = sum(int(d) * w for d, w in zip(number[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == number[17].upper()


# Every character that is a digit (written, full-width, spoken) and the digit it stands for.
_DIGIT_OF: dict[str, str] = {
    **{d: d for d in "0123456789"},
    **{chr(ord("０") + n): str(n) for n in range(10)},
    **{ch: str(n) for ch, n in DIGIT_CHARS.items()},
}
_CHECK_X = frozenset("Xx叉")  # an ID number's check character 'X', read after its 17 digits
# Stretches of the characters a digit run can hold; any other character ends a run.
_RUN_STRETCH = re.compile(f"[{re.escape(''.join(_DIGIT_OF) + ''.join(_CHECK_X) + ''.join(_SEPARATORS))}]+")


def digit_runs(text: str, min_digits: int = 1) -> list[tuple[str, list[int]]]:
    """Runs of spoken or written digits (single separators allowed inside), with each digit's
    index; only runs of at least ``min_digits`` digits.

    Only the stretches of digits, separators and 'X' (found by one regex) long enough to hold
    such a run are read a character at a time: every partial and n-best entry goes through here,
    and most of their characters cannot be in a run (一 of 一下 is a stretch of one)."""
    runs: list[tuple[str, list[int]]] = []
    for stretch in _RUN_STRETCH.finditer(text):
        if stretch.end() - stretch.start() >= min_digits:
            _stretch_runs(stretch.group(), stretch.start(), min_digits, runs)
    return runs


def _stretch_runs(stretch: str, offset: int, min_digits: int, runs: list[tuple[str, list[int]]]) -> None:
    """Append the digit runs of ``stretch`` (at ``offset`` in its text) that have at least
    ``min_digits`` digits to ``runs``."""
    digits: list[str] = []
    where: list[int] = []
    last = len(stretch) - 1
    for i, ch in enumerate(stretch):
        d = _DIGIT_OF.get(ch)
        if d is None and ch in _CHECK_X and len(digits) == 17:
            d = "X"
        if d is not None:
            digits.append(d)
            where.append(offset + i)
        elif not (ch in _SEPARATORS and digits and i < last and stretch[i + 1] in _DIGIT_OF):
            if len(digits) >= min_digits:
                runs.append(("".join(digits), where))
            digits, where = [], []
    if len(digits) >= min_digits:
        runs.append(("".join(digits), where))


def _is_phone(digits: str, before: str) -> bool:
    """Mobile, landline with area code, 400/800, +86 mobile; 7-8 digit local numbers only after a cue word."""
    if _MOBILE.fullmatch(digits) or _LANDLINE.fullmatch(digits) or _SERVICE.fullmatch(digits):
        return True
    if len(digits) == 13 and digits.startswith("86"):
        return _MOBILE.fullmatch(digits[2:]) is not None
    return len(digits) in (7, 8) and any(cue in before for cue in _PHONE_CUES)


def number_entities(text: str, min_digit_run: int = 0) -> list[Entity]:
    """The phone and ID numbers of ``text`` (and, with ``min_digit_run``, other digit runs as
    ``number``) by position: every entity redaction hides, without the place, date and time
    patterns that cost most of ``extract_entities`` (partials and n-best entries need no more)."""
    out: list[Entity] = []
    shortest = min(_SHORTEST_NUMBER, min_digit_run) if min_digit_run else _SHORTEST_NUMBER
    for digits, where in digit_runs(text, shortest):
        begin, end = where[0], where[-1] + 1
        value = text[begin:end]
        label: EntityLabel | None = None
        if len(digits) == 18 and id_checksum_ok(digits):
            label = "id_number"
        elif _is_phone(digits, text[max(0, begin - 6) : begin]):
            label = "phone"
        elif min_digit_run and len(digits) >= min_digit_run:
            label = "number"
        if label is not None:
            out.append(Entity(label, value, digits, begin, end))
    return out


def _trim_place(name: str) -> int:
    """How many leading characters of a matched place name belong to the sentence before it."""
    cut = 0
    for word in _PLACE_BOUNDARIES:
        pos = name.rfind(word, 0, len(name) - 1)
        if pos >= 0:
            cut = max(cut, pos + len(word))
    return cut


def _digits_in(value: str) -> str:
    return _NUM_RUN.sub(lambda m: numeral_to_digits(m.group()), value)


def _place_entities(text: str) -> list[Entity]:
    out: list[Entity] = []
    for pattern in (_ROAD, _ESTATE):
        for m in pattern.finditer(text):
            begin = m.start() + _trim_place(m.group("name"))
            if begin >= m.start("kind"):  # 咱们|小区, 我要投诉|大道: a kind of place, no name
                continue
            value = text[begin : m.end()]
            out.append(Entity("address", value, _digits_in(value), begin, m.end()))
    out.sort(key=lambda e: (e.begin, -e.end))
    kept: list[Entity] = []
    for entity in out:
        if kept and entity.begin < kept[-1].end:
            continue
        kept.append(entity)
    return kept


def _time_entities(text: str) -> list[Entity]:
    out = [Entity("date", m.group(), _digits_in(m.group()), m.start(), m.end()) for m in _DATE.finditer(text)]
    for m in _TIME.finditer(text):
        hour = m.group("hour")
        # 快一点 / 有点 are not times: need a period of day, a minute part, or an hour other than 一.
        if hour is not None and not (m.group("period") or m.group("rest") or hour not in ("一", "1")):
            continue
        out.append(Entity("time", m.group(), _digits_in(m.group()), m.start(), m.end()))
    return out


def extract_entities(text: str, min_digit_run: int = 0) -> list[Entity]:
    """All entities in ``text`` ordered by position; numbers win over overlapping dates and times.

    ``min_digit_run`` > 0 also reports any other digit run at least that long as ``number``
    (so redaction can hide half-spoken phone numbers in partials).
    """
    numbers = number_entities(text, min_digit_run)
    taken = [(e.begin, e.end) for e in numbers]
    others = [
        e
        for e in _place_entities(text) + _time_entities(text)
        if e.label == "address" or not any(b < e.end and e.begin < end for b, end in taken)
    ]
    return sorted(numbers + others, key=lambda e: (e.begin, e.end))
