"""Seeded generator of the labelled work-order set: synthetic two-party 12345 hotline calls.

Each call is a script of turns (the agent greets, the caller reports a manhole cover, street
light, water outage or night construction at an address of the demo's street list, says when,
gives a phone number; the agent reads it back and closes) and the work-order fields a careful
agent would file from it (``truth``): demand category (the demo's tag rules), address as
normalized (listed street, house number in digits), time (date and clock, numbers in digits),
contact (the digits) and the KB entry that applies. Numbers are written as spoken (十二号,
一三八...), so a line is exactly what its party says; only the demo model's characters are used.

``python -m recipes.workorder_calls write`` (re)writes ``recipes/testsets/workorder_calls.yaml``;
the same seed gives the same file. ``render --out DIR`` voices each call's two parties with
espeak-ng in the recipe's held-out voices, through its telephone channel, as two 8 kHz tracks
``DIR/<id>.caller.wav`` and ``DIR/<id>.agent.wav`` of equal length (each party silent, at a
line's idle noise, while the other speaks), for ``asr-bench workorder --audio DIR``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from asr_common.audio import TELEPHONE_RATE
from recipes import channel, synth
from recipes.data import write_wav
from recipes.textgen import digits_to_chinese, int_to_chinese

HERE = Path(__file__).resolve().parent
DEFAULT_SET = HERE / "testsets" / "workorder_calls.yaml"
DEFAULT_SEED = 43
DEFAULT_CALLS = 120
STREETS = ("新华路", "北京路", "中山东路", "和平路", "人民大道", "解放大街")  # the demo's street list
TURN_GAP_S = (0.5, 1.2)  # between one party's turn and the other's
IDLE_NOISE_RMS = 30.0  # int16 units: a line's idle noise (about -60 dBFS) where a party is silent


@dataclass(frozen=True)
class Demand:
    """One kind of report: its tag-rule category, its KB entry, and how callers and agents word it."""

    category: str
    kb_entry: str
    problems: tuple[str, ...]  # "{place}" is where the address goes
    read_back: str  # the agent's summary of the problem


DEMANDS = (
    Demand(
        "市政设施/井盖",
        "kb-municipal-manhole",
        ("{place}的井盖坏了，有安全隐患", "{place}门口有个井盖破损了", "{place}那边的井盖丢了，晚上很危险",
         "我发现{place}的井盖松动了"),
        "井盖破损",
    ),
    Demand(
        "市政设施/路灯",
        "kb-streetlight",
        ("{place}的路灯不亮了", "{place}那边路灯坏了，晚上很黑", "我要反映{place}的路灯不亮"),
        "路灯不亮",
    ),
    Demand(
        "供水/停水",
        "kb-water-outage",
        ("{place}停水了，一直没有水", "我们{place}家里没有水了", "{place}这边停水了，也没有通知"),
        "停水",
    ),
    Demand(
        "噪音扰民",
        "kb-noise-construction",
        ("{place}的工地半夜施工，噪音很大", "{place}附近晚上一直在施工，太吵了", "我要投诉{place}夜间施工噪音扰民"),
        "夜间施工噪音",
    ),
)  # fmt: skip
GREETINGS = (
    "您好，这里是一二三四五热线，请问有什么可以帮您",
    "您好，一二三四五热线，请讲",
    "您好，市民热线，请问您要反映什么问题",
)
OPENERS = ("你好，", "喂，你好，", "你好，我想反映一下，", "你好，那个，")
ASK_TIME = ("请问是什么时候发现的", "这个情况是从什么时候开始的", "您是什么时间发现的")
ASK_PHONE = ("请留一下您的联系电话", "您的联系电话是多少", "方便留个电话吗")
GIVE_PHONE = ("我的电话是{phone}", "电话是{phone}", "那个，{phone}")
CONFIRM = ("对的", "是的，没错", "对，就是这样")
CLOSINGS = ("好的，我们会尽快派单处理，感谢您的来电，再见", "好的，已经为您登记，请保持电话畅通，再见")
THANKS = ("好的，谢谢，再见", "谢谢你们，再见")
DATES = ("今天", "昨天", "前天")
HOURS = {"上午": (7, 11), "下午": (1, 6), "晚上": (7, 11)}  # the clock hours said after each period
PHONE_HEADS = ("13", "15", "18")


@dataclass(frozen=True)
class Truth:
    """The work-order fields filed from a call; ``time`` is "date clock" as the draft writes it."""

    category: str
    address: str
    time: str
    contact: str
    kb_entry: str


@dataclass(frozen=True)
class Call:
    """One scripted call: ``turns`` are (role, text) in the order spoken, role ``caller`` or ``agent``."""

    call_id: str
    turns: tuple[tuple[str, str], ...]
    truth: Truth

    def to_yaml(self) -> dict[str, object]:
        return {"id": self.call_id, "turns": [{role: text} for role, text in self.turns], "truth": vars(self.truth)}


def _date(rng: random.Random) -> tuple[str, str]:
    """(spoken, normalized): 今天 or 五月三号 -> 5月3号."""
    if rng.random() < 0.6:
        day = rng.choice(DATES)
        return day, day
    month, day_of_month = rng.randint(1, 12), rng.randint(1, 28)
    return f"{int_to_chinese(month)}月{int_to_chinese(day_of_month)}号", f"{month}月{day_of_month}号"


def _clock(rng: random.Random) -> tuple[str, str]:
    """(spoken, normalized): 下午三点半 -> 下午3点半."""
    period = rng.choice(tuple(HOURS))
    hour = rng.randint(*HOURS[period])
    half = "半" if rng.random() < 0.3 else ""
    spoken_hour = "两" if hour == 2 else int_to_chinese(hour)
    return f"{period}{spoken_hour}点{half}", f"{period}{hour}点{half}"


def make_call(index: int, rng: random.Random) -> Call:
    demand = rng.choice(DEMANDS)
    street = rng.choice(STREETS)
    number = rng.randint(1, 199)
    place = f"{street}{int_to_chinese(number)}号"
    (date, date_norm), (clock, clock_norm) = _date(rng), _clock(rng)
    phone = rng.choice(PHONE_HEADS) + "".join(rng.choice("0123456789") for _ in range(9))
    spoken_phone = digits_to_chinese(phone)
    problem = rng.choice(demand.problems).format(place=place)
    complaint = rng.choice(OPENERS) + problem
    when = f"{date}{clock}发现的" if rng.random() < 0.5 else f"是{date}{clock}开始的"
    turns: list[tuple[str, str]] = [("agent", rng.choice(GREETINGS))]
    if rng.random() < 0.3:  # the time in the first breath
        turns.append(("caller", f"{complaint}，{date}{clock}发现的"))
    else:
        turns += [("caller", complaint), ("agent", rng.choice(ASK_TIME)), ("caller", when)]
    turns += [
        ("agent", rng.choice(ASK_PHONE)),
        ("caller", rng.choice(GIVE_PHONE).format(phone=spoken_phone)),
        ("agent", f"好的，跟您确认一下，{place}{demand.read_back}，联系电话{spoken_phone}，对吗"),
        ("caller", rng.choice(CONFIRM)),
        ("agent", rng.choice(CLOSINGS)),
        ("caller", rng.choice(THANKS)),
    ]
    truth = Truth(demand.category, f"{street}{number}号", f"{date_norm} {clock_norm}", phone, demand.kb_entry)
    return Call(f"wo-{index:03d}", tuple(turns), truth)


def make_calls(count: int = DEFAULT_CALLS, seed: int = DEFAULT_SEED) -> list[Call]:
    """``count`` calls; the same seed gives the same calls."""
    rng = random.Random(seed)
    return [make_call(index + 1, rng) for index in range(count)]


def to_yaml(calls: Sequence[Call], seed: int) -> str:
    header = (
        "# Labelled work-order set: synthetic two-party 12345 hotline calls and their true work-order\n"
        f"# fields. Made by `python -m recipes.workorder_calls write --seed {seed} --calls {len(calls)}`;\n"
        "# do not edit by hand (recipes/testsets/README.md).\n"
    )
    body = {"version": 1, "seed": seed, "calls": [call.to_yaml() for call in calls]}
    return header + yaml.safe_dump(body, allow_unicode=True, sort_keys=False, width=200)


def render_call(call: Call, out_dir: Path, seed: int) -> None:
    """Write ``<id>.caller.wav`` and ``<id>.agent.wav``: 8 kHz int16 tracks of the same length,
    each party in its own held-out voice, every turn through the telephone channel."""
    rng = random.Random(f"{seed}:{call.call_id}")
    caller_voice = synth.sample_voice(rng, held_out=True)
    agent_voice = synth.sample_voice(rng, held_out=True)
    while agent_voice.variant == caller_voice.variant:
        agent_voice = synth.sample_voice(rng, held_out=True)
    no_pad = channel.ChannelConfig(pad_s=(0.0, 0.0))
    placed: list[tuple[str, int, np.ndarray]] = []  # (role, start sample, 8 kHz pcm)
    cursor = round(rng.uniform(*TURN_GAP_S) * TELEPHONE_RATE)
    for turn, (role, text) in enumerate(call.turns):
        samples, rate = synth.synthesize(text, caller_voice if role == "caller" else agent_voice)
        pcm = channel.telephone(samples, rate, rng.randrange(2**31) + turn, no_pad)
        placed.append((role, cursor, pcm))
        cursor += len(pcm) + round(rng.uniform(*TURN_GAP_S) * TELEPHONE_RATE)
    noise = np.random.default_rng(rng.randrange(2**31))
    tracks = {role: noise.normal(0.0, IDLE_NOISE_RMS, cursor) for role in ("caller", "agent")}
    for role, start, pcm in placed:
        tracks[role][start : start + len(pcm)] = pcm
    out_dir.mkdir(parents=True, exist_ok=True)
    for role, track in tracks.items():
        write_wav(out_dir / f"{call.call_id}.{role}.wav", np.clip(np.round(track), -32768, 32767).astype(np.int16))


def read_set(path: Path) -> tuple[int, list[Call]]:
    """(the seed it was made with, its calls) of a set file this module wrote."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    calls = [
        Call(
            raw["id"],
            tuple((role, text) for turn in raw["turns"] for role, text in turn.items()),
            Truth(**raw["truth"]),
        )
        for raw in data["calls"]
    ]
    return int(data["seed"]), calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.workorder_calls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="(re)write the set file")
    write.add_argument("--seed", type=int, default=DEFAULT_SEED)
    write.add_argument("--calls", type=int, default=DEFAULT_CALLS)
    write.add_argument("--set", type=Path, default=DEFAULT_SET, help="the file written")
    render = sub.add_parser("render", help="voice the set's calls: DIR/<id>.caller.wav, DIR/<id>.agent.wav")
    render.add_argument("--set", type=Path, default=DEFAULT_SET, help="the set file whose calls are voiced")
    render.add_argument("--out", type=Path, required=True)
    render.add_argument("--limit", type=int, default=None, help="only the first N calls")
    args = parser.parse_args(argv)
    if args.command == "write":
        args.set.write_text(to_yaml(make_calls(args.calls, args.seed), args.seed), encoding="utf-8")
        return 0
    seed, calls = read_set(args.set)
    for call in calls[: args.limit]:
        render_call(call, args.out, seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
