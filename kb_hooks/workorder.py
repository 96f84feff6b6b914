"""The work-order draft of a call, filled in from what the call's events yield.

Sans-IO: ``WorkorderDraft.observe(events)`` reads the events the processor made for one final
(``transcript.final``, ``kb.suggestion``, ``tags``) and returns the fields that changed; the
processor then publishes ``workorder.updated``. The form's fields:

* ``category``: the caller's first demand tag (the route's tag rules), with every phrase that
  matched it;
* ``address``: the latest address the caller gave (fillers dropped), normalized with numbers in
  digits and its street against the route's street list (``StreetList``: exact, homophone or one character off);
* ``time``: the latest date and time the caller gave;
* ``contact``: the latest phone number the caller gave, as published (redacted per the
  route's policy; its digits only where the route keeps numbers);
* ``statement``: the caller's finals (ITN applied where the route has it), fillers dropped;
* ``kb_entry``: the confirmed KB entry of highest priority (then score).

"The caller" is the ``caller`` participant, or the ``mixed`` one where both parties share a
stream (the agent's words then land in the statement too).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from asr_common.scoring import edit_distance
from asr_common.yamlconf import ConfigError
from kb_hooks.events import (
    DraftField,
    Event,
    KbSuggestion,
    Tag,
    Tags,
    TranscriptFinal,
    WorkorderField,
    WorkorderFields,
)
from kb_hooks.normalize import pinyin_keys
from kb_hooks.types import DEFAULT_FILLERS

FIELD_NAMES: tuple[WorkorderField, ...] = ("category", "address", "time", "contact", "statement", "kb_entry")
_CALLER_ROLES = frozenset({"caller", "mixed"})
_PUNCTUATION_RUN = re.compile(r"([，,。.！!？?、；;])[，,。.！!？?、；;\s]*")
_LEADING_PUNCTUATION = re.compile(r"^[，,。.！!？?、；;\s]+")


class StreetList:
    """Street names a route's addresses are normalized against (a hotword phrase file works:
    one name per line, ``#`` comments, a trailing `` :BOOST`` ignored)."""

    def __init__(self, streets: Iterable[str], content_hash: str = "", source: str = "") -> None:
        self.streets = tuple(dict.fromkeys(s for s in streets if s))
        self.content_hash = content_hash
        self.source = source
        self._by_pinyin = {tuple(pinyin_keys(s)): s for s in self.streets}

    def street_of(self, address: str) -> tuple[str, str] | None:
        """(the listed street, the part of ``address`` it stands for) for the street that heads
        ``address``: exact first, then same toneless pinyin, then one character off (streets of
        three or more characters); failing those, a listed street written exactly further in
        anchors the address there (麻烦派人来看看|人民大道3号: the words before it are the
        sentence's, not the street's). None when no street is found."""
        for street in sorted(self.streets, key=len, reverse=True):
            if address.startswith(street):
                return street, street
        keys = pinyin_keys(address)
        for street in sorted(self.streets, key=len, reverse=True):
            head = tuple(keys[: len(street)])
            if self._by_pinyin.get(head) == street:
                return street, address[: len(street)]
        for street in self.streets:
            if len(street) >= 3 and len(address) >= len(street):
                head_text = address[: len(street)]
                if edit_distance(street, head_text) <= 1 and street[-1] == head_text[-1]:
                    return street, head_text
        for street in sorted(self.streets, key=len, reverse=True):
            at = address.find(street)
            if at > 0:
                return street, address[: at + len(street)]
        return None

    def normalize(self, address: str) -> tuple[str, str | None]:
        """``address`` from its street on, the street written as listed, and that street (None: not listed)."""
        found = self.street_of(address)
        if found is None:
            return address, None
        street, heard = found
        return street + address[len(heard) :], street


def load_street_list(path: Path | str) -> StreetList:
    """One street per line; ConfigError naming the file when it cannot be read."""
    path = Path(path)
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: file not found"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read ({exc.strerror})"]) from None
    streets = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, sep, _boost = line.rpartition(" :")
        streets.append((head if sep else line).strip())
    return StreetList(streets, hashlib.sha256(data).hexdigest(), str(path))


def drop_fillers(text: str, fillers: Sequence[str]) -> str:
    """``text`` without the filler words, and without the punctuation they leave doubled."""
    for filler in sorted(fillers, key=len, reverse=True):
        text = text.replace(filler, "")
    text = _PUNCTUATION_RUN.sub(r"\1", text)
    return _LEADING_PUNCTUATION.sub("", text)


@dataclass
class WorkorderDraft:
    """One call's draft; ``observe`` the events of each final in the order they were made."""

    streets: StreetList | None = None
    fillers: tuple[str, ...] = DEFAULT_FILLERS
    fields: WorkorderFields = field(default_factory=WorkorderFields)
    revision: int = 0
    _statement: list[tuple[str, str]] = field(default_factory=list)  # (text, event id) per caller final
    _date: tuple[Tag, str, str] | None = None  # (tag, final's id, tags' id)
    _clock: tuple[Tag, str, str] | None = None
    _kb_rank: tuple[int, float] = (0, 0.0)  # (priority, score) of the entry in kb_entry

    def observe(self, events: Sequence[Event]) -> tuple[WorkorderField, ...]:
        """Take in one final's events; the fields that changed (the revision goes up when any did)."""
        before = self.fields
        final = next((e for e in events if isinstance(e, TranscriptFinal)), None)
        if final is None:
            return ()
        from_caller = final.participant.role in _CALLER_ROLES
        for event in events:
            if isinstance(event, Tags) and from_caller:
                self._tags(event, final)
            elif isinstance(event, KbSuggestion) and event.status == "confirmed":
                self._kb_entry(event, final)
        if from_caller:
            self._add_statement(final)
        changed = tuple(name for name in FIELD_NAMES if getattr(before, name) != getattr(self.fields, name))
        if changed:
            self.revision += 1
        return changed

    def _set(self, name: WorkorderField, value: DraftField) -> None:
        self.fields = replace(self.fields, **{name: value})

    def _tags(self, event: Tags, final: TranscriptFinal) -> None:
        ids = (final.event_id, event.event_id)
        for tag in event.tags:
            if tag.kind == "demand":
                self._category(tag, ids)
            elif tag.kind != "entity":
                continue
            elif tag.label == "address":
                heard = drop_fillers(tag.value, self.fillers)  # 那个新华路12号: the tag's place ends at no boundary
                digits = drop_fillers(tag.normalized or tag.value, self.fillers)  # 十二号 -> 12号
                normalized, street = self.streets.normalize(digits) if self.streets else (digits, None)
                self._set("address", DraftField(heard, normalized, (street,) if street else (), ids))
            elif tag.label == "phone":
                self._set("contact", DraftField(tag.value, tag.normalized, (), ids))
            elif tag.label in ("date", "time"):
                if tag.label == "date":
                    self._date = (tag, *ids)
                else:
                    self._clock = (tag, *ids)
                self._time()

    def _category(self, tag: Tag, ids: tuple[str, str]) -> None:
        current = self.fields.category
        if current is None:
            self._set("category", DraftField(tag.label, None, (tag.value,), ids))
        elif current.value == tag.label and tag.value not in current.matched:
            merged_ids = tuple(dict.fromkeys((*current.event_ids, *ids)))
            self._set("category", DraftField(tag.label, None, (*current.matched, tag.value), merged_ids))

    def _time(self) -> None:
        parts = [p for p in (self._date, self._clock) if p is not None]
        value = " ".join(tag.value for tag, _, _ in parts)
        normalized = " ".join(tag.normalized or tag.value for tag, _, _ in parts)
        ids = tuple(dict.fromkeys(i for _, *pair in parts for i in pair))
        self._set("time", DraftField(value, normalized, (), ids))

    def _kb_entry(self, event: KbSuggestion, final: TranscriptFinal) -> None:
        current = self.fields.kb_entry
        rank = (event.priority, event.score)
        if current is not None and current.normalized != event.entry_id and rank <= self._kb_rank:
            return
        self._kb_rank = rank
        self._set("kb_entry", DraftField(event.title, event.entry_id, (event.matched_text,), (event.event_id,)))

    def _add_statement(self, final: TranscriptFinal) -> None:
        text = drop_fillers(final.text, self.fillers)
        if not text:
            return
        self._statement.append((text, final.event_id))
        value = "".join(t for t, _ in self._statement)
        self._set("statement", DraftField(value, None, (), tuple(i for _, i in self._statement)))
