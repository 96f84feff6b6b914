"""Suite-wide rules: no skip off the allowlist under CI (tests/strict_skips.py)."""

from __future__ import annotations

import pytest

from tests.strict_skips import StrictSkips, strict_skips_requested


def pytest_configure(config: pytest.Config) -> None:
    if strict_skips_requested():
        config.pluginmanager.register(StrictSkips(), "strict-skips")
