"""Seeded generator of training text: 12345 hotline calls mixed with everyday Mandarin.

Hotline sentences come from hand-written templates (complaints and requests about roads,
communities, facilities, noise, water and power outages, with times, addresses, phone and ID
numbers). Everyday sentences fill simple grammatical frames with words from ``lexicon.tsv``
(frequent jieba words over the 3,500 most common characters), so that the vocabulary is wide
and a model learns characters and not only the templates.

All numbers are written out in characters (十二号, 一三八...), so the text is exactly what is
spoken. Output is a list of :class:`Sentence`; the same seed gives the same list.
Splits hold out whole templates (``TEST_TEMPLATES``) and, for the other templates, sentences
whose text never occurs in the training split.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

SEED_SENTENCE = "我今天发现新华路十二号井盖发生了破损，有安全隐患"

_DIGITS = "零一二三四五六七八九"
_PUNCTUATION = set("，。？！、；：,.?!;: ")


@dataclass(frozen=True)
class Sentence:
    """One utterance text; ``template`` names the frame it came from (``hotline.*`` or ``daily.*``)."""

    text: str
    template: str

    @property
    def transcript(self) -> str:
        """The text without punctuation: what a character-unit model should output."""
        return strip_punctuation(self.text)


@dataclass(frozen=True)
class Splits:
    train: list[Sentence]
    test_sentences: list[Sentence]
    """Unseen sentences from training templates."""
    test_templates: list[Sentence]
    """Sentences from templates never used for training."""


def strip_punctuation(text: str) -> str:
    return "".join(ch for ch in text if ch not in _PUNCTUATION)


def int_to_chinese(value: int) -> str:
    """Cardinal number as spoken: 12 -> 十二, 105 -> 一百零五, 2024 -> 二千零二十四 (0 <= value < 10^8)."""
    if not 0 <= value < 100_000_000:
        raise ValueError(f"int_to_chinese supports 0..99999999, got {value}")
    if value == 0:
        return "零"
    if value >= 10_000:
        high, low = divmod(value, 10_000)
        rest = "" if low == 0 else ("零" if low < 1000 else "") + int_to_chinese(low)
        return int_to_chinese(high) + "万" + rest
    out: list[str] = []
    zero_pending = False
    for unit_value, unit in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
        digit = value // unit_value % 10
        if digit == 0:
            zero_pending = bool(out)
            continue
        if zero_pending:
            out.append("零")
            zero_pending = False
        out.append(_DIGITS[digit] + unit)
    text = "".join(out)
    return text[1:] if text.startswith("一十") else text


def digits_to_chinese(digits: str) -> str:
    """Digit string read digit by digit, as phone and ID numbers are: "138" -> 一三八."""
    if not digits.isdigit():
        raise ValueError(f"digits_to_chinese expects only digits 0-9, got {digits!r}")
    return "".join(_DIGITS[int(d)] for d in digits)


@cache
def common_chars() -> str:
    """The 3,500 most common characters, most frequent first."""
    return (HERE / "common_chars.txt").read_text(encoding="utf-8").strip()


@cache
def lexicon() -> dict[str, tuple[list[str], list[float]]]:
    """Category -> (words, sampling weights); weights are count^0.3 to give rare words a chance."""
    table: dict[str, tuple[list[str], list[float]]] = {}
    for line in (HERE / "lexicon.tsv").read_text(encoding="utf-8").splitlines():
        word, category, count = line.split("\t")
        words, weights = table.setdefault(category, ([], []))
        words.append(word)
        weights.append(float(count) ** 0.3)
    return table


WordPicker = Callable[[random.Random, str], str]
"""Draws one everyday word of a lexicon category."""


class RareWordPicker:
    """Draws words whose rarest character has been heard least: weight 1 / (1 + n)^2, where n counts
    that character in the text so far (``counts`` to start with, plus every word drawn). Words with
    characters outside ``allowed`` are never drawn."""

    def __init__(self, counts: Counter[str], allowed: set[str]) -> None:
        self.chars = sorted(allowed)
        index = {ch: i for i, ch in enumerate(self.chars)}
        self.counts = np.array([counts.get(ch, 0) for ch in self.chars], dtype=np.float64)
        self.words: dict[str, list[str]] = {}
        self.char_ids: dict[str, np.ndarray] = {}
        for category, (words, _) in lexicon().items():
            keep = [w for w in words if set(w) <= allowed]
            width = max((len(w) for w in keep), default=1)
            ids = np.full((len(keep), width), -1, dtype=np.int64)
            for row, word in enumerate(keep):
                ids[row, : len(word)] = [index[ch] for ch in word]
            self.words[category], self.char_ids[category] = keep, ids

    def __call__(self, rng: random.Random, category: str) -> str:
        ids = self.char_ids[category]
        seen = np.where(ids >= 0, self.counts[np.maximum(ids, 0)], np.inf).min(axis=1)
        weights = np.cumsum(1.0 / (1.0 + seen) ** 2)
        row = min(int(np.searchsorted(weights, rng.random() * weights[-1], side="right")), len(ids) - 1)
        self.counts[ids[row][ids[row] >= 0]] += 1
        return self.words[category][row]


def _weighted_word(rng: random.Random, category: str) -> str:
    words, weights = lexicon()[category]
    return rng.choices(words, weights)[0]


_picker: ContextVar[WordPicker] = ContextVar("word_picker", default=_weighted_word)


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


ROADS = _words(
    "新华路 人民路 解放路 建设路 中山路 文化路 胜利路 和平路 长江路 黄河路 北京路 南京路 青年路 光明路 友谊路 "
    "东风路 朝阳路 幸福路 迎宾大道 滨江大道 红旗街 民主街 工农街 花园街 学府路 车站路"
)
COMMUNITIES = _words(
    "阳光小区 幸福家园 金色花园 绿地小区 和谐小区 春天花园 锦绣华庭 翠竹苑 碧水湾小区 东方小区 "
    "滨河新村 电力小区 教师新村 铁路宿舍 枫林小区 龙湖花园 桂花园 康乐小区"
)
FACILITIES = _words(
    "井盖 路灯 垃圾桶 下水道 红绿灯 公交站牌 人行道 护栏 消防栓 电梯 健身器材 排水沟 路面 自来水管 "
    "燃气管道 行道树 广告牌 围墙 停车位 窨井盖 减速带 座椅"
)
DAMAGE = _words("破损 丢失 损坏 倒塌 堵塞 漏水 松动 塌陷 断裂 被盗 坏了 歪了")
ISSUES = _words(
    "停水 停电 噪音扰民 违章搭建 占道经营 乱停车 垃圾没人清理 油烟扰民 施工噪音 污水外溢 物业不作为 "
    "暖气不热 楼上漏水 广场舞噪音 路面积水 水压太低 小广告太多 流浪狗伤人"
)
TIMES = _words(
    "今天上午 今天下午 今天早上 昨天晚上 前天 这两天 最近一周 三天前 上个月 每天晚上 凌晨两点 "
    "早上七点多 中午 刚才 周末 上周五 半夜"
)
OPENINGS = _words("你好 喂你好 您好 你好请问是一二三四五吗 喂")
REQUESTS = _words(
    "麻烦你们尽快处理 请尽快派人来看一下 希望相关部门重视 请帮忙解决一下 希望尽快修好 "
    "请你们管一管 能不能尽快给个答复 麻烦登记一下"
)
DEPARTMENTS = _words("城管 物业 街道办 社区 自来水公司 供电公司 交警 环保局 住建局 派出所")
PEOPLE = _words("我 我们 我家 我们小区 楼里的居民 邻居 家里老人 孩子")
RISKS = _words("有安全隐患 很危险 差点摔倒 影响出行 晚上看不见 车辆没法通行 老人孩子容易掉进去")
SURNAMES = _words("王 李 张 刘 陈 杨 赵 黄 周 吴 徐 孙 马 朱 胡 郭 何 林 高 罗")
MEASURES = _words("个 件 本 张 条 辆 位 家 只 次")
PRONOUNS = _words("我 你 他 她 我们 你们 他们 大家 老师 同学们 朋友")
DEGREES = _words("很 非常 特别 比较 有点 太 真")


def _number(rng: random.Random, low: int, high: int) -> str:
    return int_to_chinese(rng.randint(low, high))


def _phone(rng: random.Random) -> str:
    return digits_to_chinese("1" + rng.choice("3456789") + "".join(rng.choice("0123456789") for _ in range(9)))


def _id_number(rng: random.Random) -> str:
    return digits_to_chinese("".join(rng.choice("0123456789") for _ in range(18)))


def _address(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return rng.choice(ROADS) + _number(rng, 1, 300) + "号"
    if kind == 1:
        return (
            rng.choice(COMMUNITIES)
            + _number(rng, 1, 30)
            + "栋"
            + _number(rng, 1, 6)
            + "单元"
            + digits_to_chinese(f"{rng.randint(1, 30)}{rng.randint(1, 4):02d}")
            + "室"
        )
    return rng.choice(ROADS) + "和" + rng.choice(ROADS) + "交叉口"


def _word(rng: random.Random, category: str) -> str:
    return _picker.get()(rng, category)


def _hotline_templates() -> dict[str, Callable[[random.Random], str]]:
    c = random.Random.choice
    return {
        "hotline.facility_found": lambda r: (
            f"{c(r, PEOPLE)}{c(r, TIMES)}发现{_address(r)}{c(r, FACILITIES)}发生了{c(r, DAMAGE)}，{c(r, RISKS)}"
        ),
        "hotline.facility_short": lambda r: f"{c(r, ROADS)}的{c(r, FACILITIES)}{c(r, DAMAGE)}了",
        "hotline.issue_report": lambda r: f"{c(r, OPENINGS)}，我要反映{c(r, COMMUNITIES)}{c(r, ISSUES)}的问题",
        "hotline.issue_since": lambda r: f"{c(r, COMMUNITIES)}从{c(r, TIMES)}开始一直{c(r, ISSUES)}，{c(r, REQUESTS)}",
        "hotline.phone": lambda r: f"我的电话是{_phone(r)}",
        "hotline.callback": lambda r: f"{c(r, REQUESTS)}，联系电话{_phone(r)}，我姓{c(r, SURNAMES)}",
        "hotline.id_number": lambda r: f"我的身份证号是{_id_number(r)}",
        "hotline.address": lambda r: f"我住在{_address(r)}",
        "hotline.department": lambda r: f"我已经找过{c(r, DEPARTMENTS)}了，到现在还没有人处理",
        "hotline.duration": lambda r: f"这个问题已经持续{_number(r, 2, 30)}天了，{c(r, REQUESTS)}",
        "hotline.complaint": lambda r: f"我要投诉{c(r, DEPARTMENTS)}，{c(r, ISSUES)}没人管",
        "hotline.issue_time": lambda r: f"{c(r, TIMES)}{c(r, ROADS)}附近{c(r, ISSUES)}",
        "hotline.facility_risk": lambda r: f"{_address(r)}的{c(r, FACILITIES)}{c(r, DAMAGE)}，{c(r, RISKS)}",
        "hotline.consult": lambda r: f"我想咨询一下{c(r, ISSUES)}应该找哪个部门",
        "hotline.thanks": lambda r: f"好的谢谢，{c(r, REQUESTS)}",
        "hotline.people_count": lambda r: f"我们楼有{_number(r, 10, 200)}户居民都受到了影响",
        "hotline.water_out": lambda r: (
            f"{c(r, COMMUNITIES)}{_number(r, 1, 30)}号楼{c(r, TIMES)}就停水了，到现在还没来水"
        ),
        "hotline.followup": lambda r: (
            f"我{c(r, TIMES)}打过电话，工单号是{digits_to_chinese(str(r.randint(10**7, 10**8 - 1)))}"
        ),
    }


def _daily_templates() -> dict[str, Callable[[random.Random], str]]:
    c = random.Random.choice
    w = _word
    return {
        "daily.do_object": lambda r: f"{c(r, PRONOUNS)}{w(r, 't')}{w(r, 'd')}{w(r, 'v')}{w(r, 'n')}",
        "daily.quality": lambda r: f"这个{w(r, 'n')}{c(r, DEGREES)}{w(r, 'a')}",
        "daily.person_place": lambda r: (
            f"{w(r, 'nr')}在{w(r, 'ns')}{w(r, 'v')}了{_number(r, 1, 20)}{c(r, MEASURES)}{w(r, 'n')}"
        ),
        "daily.going": lambda r: f"{w(r, 't')}{c(r, PRONOUNS)}要去{w(r, 'ns')}{w(r, 'v')}",
        "daily.compare": lambda r: f"{c(r, PRONOUNS)}觉得{w(r, 'n')}比{w(r, 'n')}更{w(r, 'a')}",
        "daily.idiom": lambda r: f"{w(r, 'i')}",
        "daily.because": lambda r: f"因为{w(r, 'n')}{c(r, DEGREES)}{w(r, 'a')}，所以{c(r, PRONOUNS)}{w(r, 'v')}了",
        "daily.doing": lambda r: f"{c(r, PRONOUNS)}正在{w(r, 'v')}{w(r, 'n')}",
        "daily.place_quality": lambda r: f"{w(r, 'ns')}的{w(r, 'n')}{c(r, DEGREES)}{w(r, 'a')}",
        "daily.where": lambda r: f"请问{w(r, 'n')}在哪里",
        "daily.not_want": lambda r: f"{c(r, PRONOUNS)}{w(r, 'd')}不想{w(r, 'v')}{w(r, 'n')}",
        "daily.if": lambda r: f"如果{w(r, 't')}{w(r, 'n')}{w(r, 'a')}的话，{c(r, PRONOUNS)}就{w(r, 'v')}{w(r, 'n')}",
        "daily.and": lambda r: f"{w(r, 'n')}和{w(r, 'n')}都{c(r, DEGREES)}{w(r, 'a')}",
        "daily.ask_who": lambda r: f"{w(r, 'nr')}说{w(r, 'n')}的{w(r, 'n')}已经{w(r, 'v')}了",
    }


TEMPLATES: dict[str, Callable[[random.Random], str]] = {**_hotline_templates(), **_daily_templates()}
TEST_TEMPLATES = frozenset({"hotline.facility_risk", "hotline.followup", "daily.and", "daily.ask_who"})


def generate(
    count: int,
    seed: int,
    hotline_fraction: float = 0.6,
    templates: frozenset[str] | None = None,
    picker: WordPicker | None = None,
    exclude: frozenset[str] = frozenset(),
) -> list[Sentence]:
    """``count`` distinct sentences from ``templates`` (default: all), about ``hotline_fraction`` hotline,
    everyday words drawn by ``picker`` (default: by lexicon weight), none whose transcript is in ``exclude``."""
    token = _picker.set(picker or _weighted_word)
    try:
        return _generate(count, seed, hotline_fraction, templates, exclude)
    finally:
        _picker.reset(token)


def _generate(
    count: int, seed: int, hotline_fraction: float, templates: frozenset[str] | None, exclude: frozenset[str]
) -> list[Sentence]:
    rng = random.Random(seed)
    names = sorted(templates if templates is not None else TEMPLATES)
    hotline = [n for n in names if n.startswith("hotline.")]
    daily = [n for n in names if n.startswith("daily.")]
    seen: set[str] = set()
    out: list[Sentence] = []
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise RuntimeError(f"could only make {len(out)} distinct sentences of {count} from {names}")
        pool = hotline if daily == [] or (hotline and rng.random() < hotline_fraction) else daily
        name = rng.choice(pool)
        text = TEMPLATES[name](rng)
        if text not in seen and strip_punctuation(text) not in exclude:
            seen.add(text)
            out.append(Sentence(text, name))
    return out


def make_splits(num_train: int, num_test: int, seed: int = 0, hotline_fraction: float = 0.6) -> Splits:
    """Training sentences plus two test sets of ``num_test`` each, disjoint from training by text."""
    train_templates = frozenset(TEMPLATES) - TEST_TEMPLATES
    pool = generate(num_train + num_test, seed, hotline_fraction, train_templates)
    train = [Sentence(SEED_SENTENCE, "hotline.facility_found")] + pool[: num_train - 1]
    train_texts = {s.transcript for s in train}
    test_sentences = [s for s in pool[num_train - 1 :] if s.transcript not in train_texts][:num_test]
    test_templates = [
        s for s in generate(num_test * 2, seed + 1, hotline_fraction, TEST_TEMPLATES) if s.transcript not in train_texts
    ][:num_test]
    return Splits(train, test_sentences, test_templates)


def make_rare_set(
    count: int, seed: int, splits: Splits, hotline_fraction: float = 0.2, heard: Sequence[Sentence] = ()
) -> list[Sentence]:
    """Extra training sentences that make the training split's rare characters common: the training
    templates with words drawn by :class:`RareWordPicker`, only characters the training split
    already has (so the units stay), and no sentence of either test set. Rarity counts the training
    split plus ``heard`` (sets trained on since)."""
    known = {ch for s in splits.train for ch in s.transcript}
    counts = Counter(ch for s in (*splits.train, *heard) for ch in s.transcript if ch in known)
    picker = RareWordPicker(counts, known)
    held_out = frozenset(s.transcript for s in (*splits.test_sentences, *splits.test_templates))
    pool = generate(count * 2, seed, hotline_fraction, frozenset(TEMPLATES) - TEST_TEMPLATES, picker, held_out)
    return [s for s in pool if set(s.transcript) <= known][:count]


def char_coverage(sentences: list[Sentence]) -> tuple[int, int]:
    """(distinct characters used, how many of them are among the 3,500 most common)."""
    used = {ch for s in sentences for ch in s.transcript}
    return len(used), len(used & set(common_chars()))
