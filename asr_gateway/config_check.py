"""What ``check-config`` (and the console's config editor) checks beyond the config's own schema:
the files it names (routes, every registered feature's files: KB sets, tag and analytics rules,
street lists ..., the model) load, and the spool directory is writable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from asr_common.yamlconf import ConfigError
from asr_core.model.loader import MODEL_FILES
from asr_gateway.config import ServiceConfig
from asr_gateway.state_dir import writable_problems
from kb_hooks.features import FEATURES, Registry

T = TypeVar("T")


def check_referenced_files(config: ServiceConfig, features: Registry = FEATURES) -> list[str]:
    """Validate the files the config points at (routes, the features' files, model) and that the
    spool directory is writable; one line per problem."""
    from asr_gateway.service import load_router

    problems = _load_errors(load_router, config)
    for file_set in features.file_sets():
        for path in file_set.paths(config.kb_hooks).values():
            problems += _load_errors(file_set.load, path)
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
