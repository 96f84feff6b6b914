"""What ``check-config`` (and the console's config editor) checks beyond the config's own schema:
the files it names (routes, KB sets, tag and analytics rules, street lists, model) load, and the
spool directory is writable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from asr_common.yamlconf import ConfigError
from asr_core.model.loader import MODEL_FILES
from asr_gateway.config import ServiceConfig
from asr_gateway.state_dir import writable_problems

T = TypeVar("T")


def check_referenced_files(config: ServiceConfig) -> list[str]:
    """Validate the files the config points at (routes, KB, tag rules, model) and that the spool
    directory is writable; one line per problem."""
    from asr_gateway.service import load_router
    from kb_hooks.analytics_rules import load_analytics_rules
    from kb_hooks.kb import load_kb
    from kb_hooks.tags import load_tag_rules
    from kb_hooks.workorder import load_street_list

    problems = _load_errors(load_router, config)
    hook_files: tuple[tuple[Callable[[Path], object], dict[str, Path]], ...] = (
        (load_kb, config.kb_hooks.kb_sets),
        (load_tag_rules, config.kb_hooks.tag_rule_sets),
        (load_analytics_rules, config.kb_hooks.analytics_rule_sets),
        (load_street_list, config.kb_hooks.street_lists),
    )
    for load, paths in hook_files:
        for path in paths.values():
            problems += _load_errors(load, path)
    problems += writable_problems(config.redis.spool_dir, "redis.spool_dir")
    model_dir = config.engine.model_dir
    if model_dir is not None:
        missing = [name for name in MODEL_FILES if not (Path(model_dir) / name).is_file()]
        if missing:
            problems.append(f"{model_dir}: engine.model_dir lacks {', '.join(missing)}")
    return problems


def _load_errors(load: Callable[[T], object], source: T) -> list[str]:
    """The ``ConfigError`` lines ``load(source)`` raises; none when it loads."""
    try:
        load(source)
    except ConfigError as exc:
        return list(exc.errors)
    return []
