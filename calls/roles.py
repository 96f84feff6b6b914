"""Who is speaking on a leg: the roles a transcript is published under, and how a recording's
streams get theirs from the parties' AORs and the order of the streams."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Role = Literal["caller", "agent", "mixed"]
"""``caller`` and ``agent`` are one party each; ``mixed`` is both parties on one stream."""


@dataclass(frozen=True)
class RoleRule:
    """How a recorded stream gets its role: AOR patterns first, then the order of the streams."""

    agent_aor: str | None = None
    caller_aor: str | None = None
    label_order: tuple[Role, ...] = ("caller", "agent")


def assign_roles(rule: RoleRule, aors: list[str | None]) -> list[Role]:
    """Roles of the streams (in offer order) sent by ``aors``.

    A stream whose AOR matches a pattern takes that role; the others take, in order, the
    roles of ``label_order`` that no pattern gave away, then ``mixed``.
    """
    matched: list[Role | None] = []
    for aor in aors:
        if aor is not None and rule.agent_aor and re.search(rule.agent_aor, aor):
            matched.append("agent")
        elif aor is not None and rule.caller_aor and re.search(rule.caller_aor, aor):
            matched.append("caller")
        else:
            matched.append(None)
    free = [role for role in rule.label_order if role not in matched]
    return [role if role is not None else (free.pop(0) if free else "mixed") for role in matched]
