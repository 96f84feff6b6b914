"""Strict skips: under CI a test may skip only for a reason on ``ALLOWED_SKIPS``.

A skip hides a test as well as a pass does: a missing WeNet fixture, a C extension that did not
build or a tool the Makefile installs all used to skip hundreds of tests in a green run. With
``ASR_STRICT_SKIPS=1`` (``make test`` and ``.ci/run`` set it) every skip, at collection or in a
test, whose reason matches no entry below is listed at the end of the run and the session fails.
The allowlist names what a machine may lack while the product is still sound on it; anything
else is a broken setup, to be repaired rather than skipped.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict

import pytest

STRICT_ENV = "ASR_STRICT_SKIPS"

# (pattern searched in the skip reason, why a machine that CI or a newcomer uses may lack it)
ALLOWED_SKIPS: tuple[tuple[str, str], ...] = (
    (
        r"no CUDA device|needs a CUDA device|refusal on a machine without a GPU",
        "the GPU paths need a CUDA device, which CI and most development machines lack (and the "
        "CPU-only refusal is checked only where there is none)",
    ),
    (
        r"tensorrt is (not )?installed",
        "TensorRT comes with the gpu extra, which `make setup` does not install (and the check "
        "of its absence skips where it is installed)",
    ),
    (
        r"Bf16Convs run only|needs oneDNN bf16 kernels",
        "native bf16 convolutions need AVX512-BF16 or AMX (or AVX-512 for oneDNN's bf16 kernels): "
        "AVX2-only CPUs and .ci/run's AVX2-capped rerun lack them",
    ),
    (
        r"Int8Convs run only",
        "int8 convolutions need VNNI or AMX: older CPUs and .ci/run's AVX2-capped rerun lack them",
    ),
)
_ALLOWED = re.compile("|".join(f"(?:{pattern})" for pattern, _why in ALLOWED_SKIPS))


def strict_skips_requested() -> bool:
    return os.environ.get(STRICT_ENV, "").lower() in ("1", "true", "yes")


def skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The reason a skipped report carries, without pytest's ``Skipped: `` prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def allowed(reason: str) -> bool:
    return _ALLOWED.search(reason) is not None


class StrictSkips:
    """Collects the skips off the allowlist and fails the session when there are any."""

    def __init__(self) -> None:
        self.unexpected: dict[str, list[str]] = defaultdict(list)  # reason -> node ids

    def _note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        reason = skip_reason(report)
        if not allowed(reason):
            self.unexpected[reason].append(report.nodeid)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self._note(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is not a skip
            self._note(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unexpected and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.unexpected:
            return
        count = sum(len(ids) for ids in self.unexpected.values())
        plural = "" if count == 1 else "s"
        terminalreporter.section(f"{count} unexpected skip{plural} ({STRICT_ENV}=1)", sep="=", red=True, bold=True)
        for reason, node_ids in sorted(self.unexpected.items()):
            terminalreporter.line(f"{reason} ({len(node_ids)}):")
            for node_id in node_ids[:5]:
                terminalreporter.line(f"    {node_id}")
            if len(node_ids) > 5:
                terminalreporter.line(f"    ... and {len(node_ids) - 5} more")
        terminalreporter.line(
            "Only the skips on tests/strict_skips.py's ALLOWED_SKIPS may happen under CI: install what is missing "
            "(`make setup`; the WeNet fixture in ../shared/fixtures/ beside the checkout) or fix what no longer "
            f"builds. `make test {STRICT_ENV}=0` runs without this rule."
        )
