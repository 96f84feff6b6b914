"""Suite-wide rules: no skip off the allowlist under CI (tests/strict_skips.py), and no test
leaves a ``CallBridge`` whose worker failed unless it says it expects that."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from tests.strict_skips import StrictSkips, strict_skips_requested

pytest_plugins = ("pytester",)  # tests/test_strict_skips.py runs pytest on small test files

BRIDGE_MODULE = "asr_gateway.bridge"  # where CallBridge lives; imported by the tests that need it


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "worker_errors_expected: the test means a CallBridge's worker to fail (worker_errors > 0)"
    )
    if strict_skips_requested():
        config.pluginmanager.register(StrictSkips(), "strict-skips")


def _bridge_class() -> type[Any] | None:
    module = sys.modules.get(BRIDGE_MODULE)
    if module is None:
        return None
    bridge_class = getattr(module, "CallBridge", None)
    if not isinstance(bridge_class, type):
        raise RuntimeError(f"{BRIDGE_MODULE} has no CallBridge class: point tests/conftest.py at its new home")
    return bridge_class


@pytest.fixture(autouse=True)
def bridge_worker_errors_fail(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a test that leaves a ``CallBridge.worker_errors`` above 0: the worker logs and counts
    an exception per message (a fake missing a method, a bug in post-processing) and goes on, so
    the test would otherwise pass. Mark a test ``@pytest.mark.worker_errors_expected`` when
    the failure is what it checks. (Bridges in a child process are not seen.)"""
    bridges: weakref.WeakSet[Any] = weakref.WeakSet()
    bridge_class = _bridge_class()  # None: not imported yet; a bridge made in this test is found below
    if bridge_class is not None:
        real_init = bridge_class.__init__

        def tracking_init(self: Any, *args: Any, **kwargs: Any) -> None:
            real_init(self, *args, **kwargs)
            bridges.add(self)

        monkeypatch.setattr(bridge_class, "__init__", tracking_init)
    yield
    if bridge_class is None and (imported := _bridge_class()) is not None:
        # once a session at most; type(), not isinstance(): some objects (torch's deprecated
        # module aliases) warn when their __class__ is read
        bridges.update(obj for obj in gc.get_objects() if issubclass(type(obj), imported))
    if request.node.get_closest_marker("worker_errors_expected") is not None:
        return
    failed = [bridge.worker_errors for bridge in bridges if bridge.worker_errors > 0]
    if failed:
        pytest.fail(
            f"a CallBridge's worker failed {sum(failed)} time(s) in this test (its log has each traceback); "
            "mark the test @pytest.mark.worker_errors_expected if that is what it checks",
            pytrace=False,
        )
