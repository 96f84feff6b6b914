"""The per-route features, one module each, and ``FEATURES``: the registry the service runs.

Config check (``asr_gateway.config_check``), reloading (``asr_gateway.reloading``), the
processor (``kb_hooks.processor``), the call context (``asr_gateway.call_context``) and the
console's try-it all read the registry they are given, ``FEATURES`` unless told otherwise.
A new feature is a module here (``base.Feature``), a line below, and its profile key in
``calls.profile.Profile``.
"""

from __future__ import annotations

from kb_hooks.features import analytics, entities, hotwords, itn, kb, punctuation, redaction, tags, workorder
from kb_hooks.features.base import Feature, FileSet, FinalStep, NodeDefaults, Registry, RouteSettings

FEATURES = Registry(
    (
        redaction.FEATURE,
        entities.FEATURE,
        itn.FEATURE,  # rewrites before punctuation: punctuation reads the digits
        punctuation.FEATURE,
        kb.FEATURE,
        tags.FEATURE,
        analytics.FEATURE,
        workorder.FEATURE,  # after tags: the draft reads them
        hotwords.FEATURE,
    )
)

__all__ = ["FEATURES", "Feature", "FileSet", "FinalStep", "NodeDefaults", "Registry", "RouteSettings"]
