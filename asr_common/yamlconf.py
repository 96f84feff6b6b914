"""YAML files validated by pydantic models, with errors that name file, line and key.

Admins edit the service config, the routes, the KB and the tag rules by hand; an error
must say where it is (``config.yaml:12 engine.chunk_ms: ...``) and what is allowed. Every
package loads the files it owns with it, so it lives in ``asr_common``, below all of them.
Checks pydantic cannot do (duplicate ids, regular expressions) head their lines with ``locate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)

KeyIndex = Mapping[tuple[str | int, ...], int]
"""Key path (``("entries", 3, "keywords", 0)``) -> 1-based line, as ``read_yaml`` returns it."""


class ConfigError(Exception):
    """One or more problems in a configuration file; ``errors`` holds one line per problem."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


def _line_index(node: yaml.Node | None, prefix: tuple[str | int, ...] = ()) -> dict[tuple[str | int, ...], int]:
    """Map every key path in a composed YAML node tree to its 1-based line number."""
    index: dict[tuple[str | int, ...], int] = {}
    if node is None:
        return index
    index[prefix] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            index.update(_line_index(value_node, prefix + (key,)))
            # A key's own line is where its name stands, not where its value starts.
            index[prefix + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            index.update(_line_index(item, prefix + (i,)))
    return index


def locate(path: Path | str, index: KeyIndex, loc: tuple[str | int, ...]) -> str:
    """``file:line dotted.key``: the head of an error line about ``loc``. The line is that of
    ``loc`` or, for a missing key, of its closest existing parent; ``()`` reads ``(top level)``."""
    line = next((index[loc[:cut]] for cut in range(len(loc), -1, -1) if loc[:cut] in index), 1)
    dotted = ".".join(str(part) for part in loc) or "(top level)"
    return f"{path}:{line} {dotted}"


def _describe(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    message = str(error.get("msg", "invalid value"))
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    value = error.get("input")
    if not isinstance(value, (dict, list)):
        return f"{value!r} is invalid: {message}"
    return message


def _is_branch_tag(part: str | int) -> bool:
    """pydantic names union branches and validators inside ``loc``; they are not keys of the file."""
    return isinstance(part, str) and (part.startswith("function-") or any(c in part for c in "[]()"))


def _file_loc(loc: Sequence[str | int], index: KeyIndex) -> tuple[str | int, ...]:
    """``loc`` without the tags of discriminated unions: pydantic puts the tag (``kind: greeting``
    -> ``greeting``) between an item and its keys, where the file has no such key."""
    kept: tuple[str | int, ...] = ()
    for i, part in enumerate(loc):
        is_tag = (
            isinstance(part, str)
            and kept in index
            and kept + (part,) not in index
            and i + 1 < len(loc)
            and kept + (loc[i + 1],) in index
        )
        if not is_tag:
            kept += (part,)
    return kept


def format_validation_error(path: Path | str, exc: ValidationError, index: KeyIndex) -> list[str]:
    """Turn a pydantic error into ``file:line dotted.key: message`` lines (one per key)."""
    by_loc: dict[tuple[str | int, ...], list[str]] = {}
    for error in exc.errors():
        loc = _file_loc([part for part in error["loc"] if not _is_branch_tag(part)], index)
        messages = by_loc.setdefault(loc, [])
        message = _describe(error)
        if message not in messages:
            messages.append(message)
    lines = []
    for loc, messages in by_loc.items():
        # Union types fail once per branch: "X is invalid: A", "X is invalid: B" -> "X is invalid: A; or B".
        head, _, first = messages[0].partition(" is invalid: ")
        rest = [m.partition(" is invalid: ")[2] or m for m in messages[1:]]
        text = f"{head} is invalid: {'; or '.join([first, *rest])}" if first else "; ".join(messages)
        lines.append(f"{locate(path, index, loc)}: {text}")
    return lines


def read_yaml(path: Path | str) -> tuple[Any, dict[tuple[str | int, ...], int]]:
    """Parse a YAML file into Python data plus a key-path -> line index."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read: {exc}"]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{where} YAML syntax error: {problem}"]) from None
    return data, _line_index(node)


def validate_data(path: Path | str, data: Any, model: type[ModelT], index: KeyIndex) -> ModelT:
    """Validate already-parsed data, reporting errors against ``path`` and ``index``."""
    try:
        return model.model_validate({} if data is None else data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(path, exc, index)) from None


def load_yaml_model(path: Path | str, model: type[ModelT]) -> ModelT:
    """Load ``path`` and validate it as ``model``; raise ConfigError with file:line messages."""
    data, index = read_yaml(path)
    return validate_data(path, data, model, index)
