"""Regenerate the committed character list and lexicon from jieba's word-frequency dictionary.

jieba ships ``dict.txt`` (349k words with corpus counts and part-of-speech tags). The most
common characters are ranked by the summed counts of the words they appear in; the lexicon
keeps the frequent words of a few parts of speech, made of those characters only, plus for
every common character its most frequent word, so that generated text can reach all of them.

Only needed to refresh ``common_chars.txt`` and ``lexicon.tsv``; the recipe and the tests read
the committed files and do not need jieba::

    pip install jieba && python -m recipes.lexicon_build
"""

from __future__ import annotations

import argparse
import importlib.util
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHARS_FILE = HERE / "common_chars.txt"
LEXICON_FILE = HERE / "lexicon.tsv"

# jieba tag -> our category, and how many of the most frequent words to keep per category.
# Names, places, times and idioms must have at least MIN_LENGTH characters: jieba tags many
# single characters as names or places, which would make nonsense in those slots.
CATEGORIES: dict[str, tuple[str, int]] = {
    "n": ("n", 3500),
    "vn": ("n", 500),
    "v": ("v", 2200),
    "a": ("a", 700),
    "ad": ("d", 60),
    "d": ("d", 250),
    "ns": ("ns", 500),
    "nr": ("nr", 400),
    "t": ("t", 150),
    "i": ("i", 250),
    "l": ("i", 150),
}

MIN_LENGTH = {"nr": 2, "ns": 2, "t": 2, "i": 4}


def _is_han(text: str) -> bool:
    return all("\u4e00" <= ch <= "\u9fff" for ch in text)


def read_jieba_dict() -> list[tuple[str, int, str]]:
    """(word, count, tag) rows of jieba's dict.txt; raises if jieba is not installed."""
    spec = importlib.util.find_spec("jieba")
    if spec is None or spec.origin is None:
        raise SystemExit("jieba is not installed: `pip install jieba` to rebuild the lexicon")
    rows = []
    with open(Path(spec.origin).parent / "dict.txt", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and _is_han(parts[0]):
                rows.append((parts[0], int(parts[1]), parts[2]))
    return rows


def build(num_chars: int = 3500) -> tuple[list[str], list[tuple[str, str, int]]]:
    """Return (common chars by rank, lexicon rows (word, category, count))."""
    rows = read_jieba_dict()
    char_count: Counter[str] = Counter()
    for word, count, _ in rows:
        for ch in word:
            char_count[ch] += count
    chars = [ch for ch, _ in char_count.most_common(num_chars)]
    allowed = set(chars)
    usable = [
        r for r in rows if MIN_LENGTH.get(r[2], 1) <= len(r[0]) <= 4 and set(r[0]) <= allowed and r[2] in CATEGORIES
    ]
    usable.sort(key=lambda r: -r[1])
    lexicon: dict[str, tuple[str, int]] = {}
    taken: Counter[str] = Counter()
    for word, count, tag in usable:
        if word not in lexicon:
            category, limit = CATEGORIES[tag]
            if taken[tag] < limit:
                lexicon[word] = (category, count)
                taken[tag] += 1
    covered = {ch for word in lexicon for ch in word}
    for word, count, tag in usable:
        if word not in lexicon and not set(word) <= covered:
            lexicon[word] = (CATEGORIES[tag][0], count)
            covered |= set(word)
    return chars, [(w, c, n) for w, (c, n) in lexicon.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-chars", type=int, default=3500)
    args = parser.parse_args()
    chars, lexicon = build(args.num_chars)
    CHARS_FILE.write_text("".join(chars) + "\n", encoding="utf-8")
    lexicon.sort(key=lambda r: (r[1], -r[2], r[0]))
    LEXICON_FILE.write_text("".join(f"{w}\t{c}\t{n}\n" for w, c, n in lexicon), encoding="utf-8")
    print(f"{len(chars)} chars -> {CHARS_FILE.name}; {len(lexicon)} words -> {LEXICON_FILE.name}")


if __name__ == "__main__":
    main()
