"""Logging: structlog configured once for the whole process.

JSON lines when stderr is not a terminal (production, journald, containers), readable
colored lines on a TTY. Everything a call does carries its ``call_id``: bind it with
``bind_call(call_id)`` (contextvars, so it follows asyncio tasks) or ``log.bind``.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(
    level: Literal["debug", "info", "warning", "error"] = "info",
    fmt: Literal["auto", "json", "console"] = "auto",
) -> None:
    """Route structlog and the standard library's logging through one renderer on stderr."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.types.Processor
    if use_console:
        renderer = structlog.dev.ConsoleRenderer()
    else:
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer(ensure_ascii=False)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processor=renderer))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])


def bind_call(call_id: str) -> None:
    """Attach ``call_id`` to every log line of the current task/thread context."""
    structlog.contextvars.bind_contextvars(call_id=call_id)


def unbind_call() -> None:
    structlog.contextvars.unbind_contextvars("call_id")
