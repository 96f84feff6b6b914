"""Call analytics: talk, silence, overlaps, speaking rate and a route's checks and categories,
published as ``call.analytics`` when the call ends (``kb_hooks.analytics``, ``analytics_rules``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kb_hooks.analytics import AnalyzedFinal, measure, spoken_chars
from kb_hooks.analytics_rules import AnalyticsRules, RecentAddresses, load_analytics_rules
from kb_hooks.entities import Entity
from kb_hooks.events import CallAnalytics, CategoryHit, Event, RuleCheck
from kb_hooks.features.base import Feature, FileSet, FinalStep, NodeDefaults, RouteSettings
from kb_hooks.reload import ReloadableRef
from kb_hooks.types import CallContext, TranscriptUpdate


def _fields(route: RouteSettings, node: NodeDefaults) -> dict[str, Any]:
    return {"analytics_rules": route.get("analytics_rules")}


def finals(state: dict[str, Any]) -> list[AnalyzedFinal]:
    """The finals a call's analytics state kept (``TranscriptProcessor.call_analytics`` reads them)."""
    kept: list[AnalyzedFinal] = state.setdefault("finals", [])
    return kept


def _on_final(step: FinalStep) -> list[Event]:
    """Keep the final for the call's ``call.analytics``; nothing is published per final."""
    if step.ctx.analytics_rules is not None:
        finals(step.state).append(utterance(step.update, step.entities))
    return []


def utterance(final: TranscriptUpdate, entities: Sequence[Entity]) -> AnalyzedFinal:
    """A final as ``kb_hooks.analytics`` reads it (the text before redaction: phrases and
    addresses are matched in it, and only the rules' phrases and addresses are published)."""
    return AnalyzedFinal(
        role=final.participant.role,
        utterance_id=final.utterance_id,
        text=final.text,
        spoken_chars=spoken_chars(final.text_raw if final.text_raw is not None else final.text),
        begin_ms=final.begin_offset_ms,
        end_ms=final.end_offset_ms,
        tokens=final.tokens,
        addresses=tuple(e.normalized for e in entities if e.label == "address"),
    )


def call_analytics(
    ctx: CallContext,
    state: dict[str, Any],
    duration_ms: int,
    rules: ReloadableRef[AnalyticsRules] | None,
    recent: RecentAddresses,
    clock: Callable[[], float],
) -> CallAnalytics:
    """The call's ``call.analytics`` from the finals its ``state`` kept: the numbers, and the
    checks and categories of ``rules`` (None: the route's rule set is not loaded); ``recent``
    holds the addresses of the node's earlier calls (``repeat_address``), ``clock`` unix s."""
    finals_kept = finals(state)
    numbers = measure(finals_kept, duration_ms)
    checks: tuple[RuleCheck, ...] = ()
    categories: tuple[CategoryHit, ...] = ()
    if rules is not None and ctx.analytics_rules is not None:
        now = clock()
        addresses = {a for u in finals_kept if u.role != "agent" for a in u.addresses}
        earlier = recent.hours_since(ctx.analytics_rules, addresses, now)
        checks, categories = rules.get().evaluate(finals_kept, numbers.duration_ms, earlier)
        recent.remember(ctx.analytics_rules, addresses, now)
    return CallAnalytics(
        call=ctx,
        duration_ms=numbers.duration_ms,
        talk_ms=numbers.talk_ms,
        non_talk_ms=numbers.non_talk_ms,
        overlap=numbers.overlap,
        speaking_rate=numbers.speaking_rate,
        checks=checks,
        categories=categories,
    )


FEATURE = Feature(
    name="analytics",
    route_keys=("analytics_rules",),
    node_settings=("analytics_rule_sets",),
    file_sets=(FileSet("analytics", "analytics_rule_sets", load_analytics_rules, route_key="analytics_rules"),),
    per_event="finals: kept for the call (nothing published); at call end call_analytics above "
    "(through TranscriptProcessor.call_analytics, which the bridge asks) makes call.analytics, "
    "published before call.ended",
    fields=_fields,
    on_final=_on_final,
)
