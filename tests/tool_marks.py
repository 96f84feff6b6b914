"""Skip marks for tests that need a program the Debian packages install (``needs_chromium``, for
the browser, lives in ``browser_helpers`` with its driver)."""

from __future__ import annotations

import shutil

import pytest

needs_sipp = pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp not installed (Debian package sip-tester)")
needs_redis_server = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
