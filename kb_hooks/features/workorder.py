"""The work-order draft: the form a call fills in as it goes (``kb_hooks.workorder``)."""

from __future__ import annotations

from typing import Any

from kb_hooks.events import Event, WorkorderUpdated
from kb_hooks.features.base import Feature, FileSet, FinalStep, NodeDefaults, RouteSettings
from kb_hooks.types import WorkorderOptions
from kb_hooks.workorder import StreetList, WorkorderDraft, load_street_list


def _fields(route: RouteSettings, node: NodeDefaults) -> dict[str, Any]:
    """``workorder: {streets, fillers}`` (unset fillers: the default ones); no section: no draft."""
    section = route.get("workorder")
    if section is None:
        return {"workorder": None}
    fillers = section.get("fillers")
    if fillers is None:
        return {"workorder": WorkorderOptions(section.get("streets"))}
    return {"workorder": WorkorderOptions(section.get("streets"), tuple(fillers))}


def _on_final(step: FinalStep) -> list[Event]:
    """``workorder.updated`` where this final's events changed the draft."""
    ctx, options = step.ctx, step.ctx.workorder
    if options is None:
        return []
    draft: WorkorderDraft | None = step.state.get("draft")
    if draft is None:
        ref = step.files.get(options.streets) if options.streets else None
        streets: StreetList | None = ref.get() if ref is not None else None
        draft = step.state["draft"] = WorkorderDraft(streets, options.fillers)
    changed = draft.observe(step.events)
    if not changed:
        return []
    return [WorkorderUpdated(call=ctx, workorder_id=ctx.call_id, revision=draft.revision, changed=changed,
                             fields=draft.fields)]  # fmt: skip


FEATURE = Feature(
    name="workorder",
    route_keys=("workorder",),
    node_settings=("street_lists",),
    file_sets=(FileSet("streets", "street_lists", load_street_list, route_key="workorder.streets"),),
    per_event="finals: the draft observes the final's transcript, suggestions and tags; "
    "workorder.updated where a field changed",
    fields=_fields,
    on_final=_on_final,
)
