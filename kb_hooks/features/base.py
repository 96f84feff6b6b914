"""What a per-route feature declares, and the registry the service, config check, reloading and
the console's try-it read.

A feature is one frozen ``Feature`` record: the profile keys and node settings it reads, the
files it loads (``FileSet``: which ``kb_hooks`` setting names them, how one is loaded and
checked), how a call's ``CallContext`` gets its part (``fields`` or ``option``), and what it
does per event (``rewrite`` a final before redaction, ``on_final`` after the processor's own
events), or ``per_event`` in words where its work happens elsewhere (hotwords: the engine).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kb_hooks.config import KbHooksSettings
from kb_hooks.entities import Entity
from kb_hooks.events import Event
from kb_hooks.reload import ReloadableRef
from kb_hooks.types import CallContext, RedactionMode, TranscriptUpdate

RouteSettings = Mapping[str, Any]
"""A route's profile as plain values (``calls.profile.Profile.model_dump()``): kb_hooks does not
use the call model, so a feature reads its keys by name."""


@dataclass(frozen=True)
class NodeDefaults:
    """The node's settings a call's context falls back on where its route leaves a key unset."""

    redaction: RedactionMode = RedactionMode.MASK

    @classmethod
    def from_settings(cls, settings: KbHooksSettings) -> NodeDefaults:
        return cls(redaction=settings.default_redaction)


@dataclass(frozen=True)
class FileSet:
    """Files a feature loads: ``kb_hooks.<setting>`` maps names (which routes refer to) to paths.

    ``kind`` names them everywhere else: ``KIND:NAME`` in reload results, content hashes and the
    console's file keys. ``load`` raises ``ConfigError`` with ``file:line`` messages; the same
    function loads at start, reloads, and checks (``check-config``, the console's validation).
    ``route_key``: the profile key that names one of them (``workorder.streets``: a key of the
    profile's ``workorder`` section); a name the node does not know is a problem of the routes.
    """

    kind: str
    setting: str
    load: Callable[[Path], object]
    route_key: str | None = None

    def paths(self, settings: KbHooksSettings) -> dict[str, Path]:
        """Name -> path of this set's files in ``settings``."""
        named: Mapping[str, Path] = getattr(settings, self.setting)
        return dict(named)

    def route_problem(self, route: RouteSettings, settings: KbHooksSettings) -> str | None:
        """Why the name ``route`` gives at ``route_key`` is unusable (None: it names a known file, or none)."""
        if self.route_key is None:
            return None
        value: Any = route
        for part in self.route_key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        known = self.paths(settings)
        if value is None or value in known:
            return None
        listed = ", ".join(sorted(known)) or "none"
        return f"{self.route_key} {value!r} is not in kb_hooks.{self.setting} ({listed})"


@dataclass
class FinalStep:
    """What a feature's ``on_final`` sees of one final, after the processor's own events."""

    update: TranscriptUpdate  # the final as rewritten (ITN, punctuation ...), before redaction
    entities: Sequence[Entity]  # found in ``update.text``
    events: Sequence[Event]  # made of this final so far: transcript, suggestions, tags, earlier features'
    files: Mapping[str, ReloadableRef[Any]]  # the feature's files in force (all its file sets), by name
    state: dict[str, Any]  # the feature's own per-call state, kept until the call ends

    @property
    def ctx(self) -> CallContext:
        return self.update.call


ContextFields = Callable[[RouteSettings, NodeDefaults], Mapping[str, Any]]
ContextOption = Callable[[RouteSettings, NodeDefaults], object]
Rewrite = Callable[[TranscriptUpdate], TranscriptUpdate]
OnFinal = Callable[[FinalStep], list[Event]]


@dataclass(frozen=True)
class Feature:
    """One per-route feature, declared once (``kb_hooks/features/<name>.py``).

    ``fields``: the ``CallContext`` fields it sets (the features it was built with);
    ``option``: any other feature's value in ``CallContext.options[name]`` (None: left out).
    ``rewrite``: finals only, in registry order, before redaction; it returns the update itself
    where the call's route leaves it off (any other object: ``text_raw`` keeps the engine's
    text). ``on_final``: the events it adds for a final.
    """

    name: str
    route_keys: tuple[str, ...]  # the Profile keys it reads
    per_event: str  # what it does per event, in words (docs, the console)
    node_settings: tuple[str, ...] = ()  # the KbHooksSettings fields it reads
    file_sets: tuple[FileSet, ...] = ()
    fields: ContextFields | None = None
    option: ContextOption | None = None
    rewrite: Rewrite | None = None
    on_final: OnFinal | None = None


@dataclass(frozen=True)
class Registry:
    """The features a service runs, in the order they act on a final."""

    features: tuple[Feature, ...] = field(default=())

    def __post_init__(self) -> None:
        names = [f.name for f in self.features]
        kinds = [s.kind for f in self.features for s in f.file_sets]
        for what, values in (("feature", names), ("file kind", kinds)):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(f"{what} {', '.join(twice)} registered twice")

    def __iter__(self) -> Iterator[Feature]:
        return iter(self.features)

    def plus(self, feature: Feature) -> Registry:
        """These features and ``feature`` after them (a name or file kind already taken: ValueError)."""
        return Registry((*self.features, feature))

    def file_sets(self) -> tuple[FileSet, ...]:
        return tuple(s for f in self.features for s in f.file_sets)

    def file_set(self, kind: str) -> FileSet:
        """The file set of ``kind`` (KeyError: none)."""
        for file_set in self.file_sets():
            if file_set.kind == kind:
                return file_set
        raise KeyError(kind)

    def route_problems(self, route: RouteSettings, settings: KbHooksSettings) -> list[str]:
        """What in a route's settings names a file the node does not have (one line each)."""
        problems = (file_set.route_problem(route, settings) for file_set in self.file_sets())
        return [problem for problem in problems if problem is not None]

    def context(self, route: RouteSettings, node: NodeDefaults) -> tuple[dict[str, Any], dict[str, object]]:
        """A call's ``CallContext`` fields and options for a route with settings ``route``."""
        values: dict[str, Any] = {}
        options: dict[str, object] = {}
        for feature in self.features:
            if feature.fields is not None:
                values.update(feature.fields(route, node))
            if feature.option is not None:
                value = feature.option(route, node)
                if value is not None:
                    options[feature.name] = value
        return values, options
