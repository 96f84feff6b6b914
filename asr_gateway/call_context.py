"""A call's ``kb_hooks.CallContext`` from its route's ``Profile``: the one place it is built.

The bridge builds every call's context here, and the console's try-it builds its own here too,
so what try-it shows is what a call of the route gets. The registered features
(``kb_hooks.features``) each fill their part from the profile as plain values; the route, the
ids and the key prefix are the call's own.
"""

from __future__ import annotations

from calls.call import CallInfo
from calls.profile import Profile
from kb_hooks.features import FEATURES, NodeDefaults, Registry
from kb_hooks.types import CallContext


def profile_context(
    profile: Profile,
    node: NodeDefaults,
    *,
    call_id: str,
    route: str | None,
    source_call_id: str | None = None,
    features: Registry = FEATURES,
) -> CallContext:
    """The context of a call routed to ``route`` with ``profile``, on a node with ``node``'s defaults."""
    values, options = features.context(profile.model_dump(), node)
    return CallContext(
        call_id=call_id,
        source_call_id=source_call_id,
        route=route,
        key_prefix=profile.key_prefix,
        options=options,
        **values,
    )


def call_context(call: CallInfo, node: NodeDefaults, features: Registry = FEATURES) -> CallContext:
    """The context every event of ``call`` carries."""
    return profile_context(
        call.profile, node, call_id=call.call_id, route=call.route, source_call_id=call.source_call_id,
        features=features,
    )  # fmt: skip
