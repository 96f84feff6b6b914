"""The suite's own guards (tests/conftest.py): under ASR_STRICT_SKIPS=1 a skip off the allowlist
fails the run, and a CallBridge whose worker failed fails its test unless the test expects it.
Each is checked by running pytest on a small test file (pytester)."""

from __future__ import annotations

import pytest

from tests.strict_skips import allowed

STRICT_CONFTEST = """
from tests.strict_skips import StrictSkips

def pytest_configure(config):
    config.pluginmanager.register(StrictSkips(), "strict-skips")
"""


@pytest.mark.parametrize(
    "reason",
    [
        "no CUDA device on this machine",
        "tensorrt is not installed (extra: hotline-asr[gpu])",
        "Bf16Convs run only where oneDNN computes bf16 natively (AVX512-BF16 or AMX, not capped below)",
        "Int8Convs run only with oneDNN, torch._int_mm and a CPU with VNNI or AMX (not capped below)",
    ],
)
def test_what_a_machine_may_lack_is_allowed(reason: str) -> None:
    assert allowed(reason)


@pytest.mark.parametrize(
    "reason",
    [
        "WeNet fixture not found at ../shared/fixtures/wenet_u2pp_small",
        "golden fixture not found",
        "rtp._fastrtp (the C receive path) is not built",
        "sipp not installed (Debian package sip-tester)",
        "asr_core.model (the WeNet model) has not landed yet",
    ],
)
def test_a_broken_setup_is_not(reason: str) -> None:
    assert not allowed(reason)


def test_a_skip_off_the_allowlist_fails_the_run_and_is_listed(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(STRICT_CONFTEST)
    pytester.makepyfile(
        test_module_skip="""
        import pytest
        pytest.skip("WeNet fixture not found at ../shared/fixtures/wenet_u2pp_small", allow_module_level=True)
        """,
        test_some="""
        import pytest

        def test_passes():
            pass

        @pytest.mark.skipif(True, reason="no CUDA device on this machine")
        def test_on_a_gpu():
            pass

        def test_needs_a_tool():
            pytest.skip("the frobnicator is not installed")
        """,
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines(
        [
            "*2 unexpected skips (ASR_STRICT_SKIPS=1)*",
            "WeNet fixture not found at ../shared/fixtures/wenet_u2pp_small (1):",
            "    test_module_skip.py",
            "the frobnicator is not installed (1):",
            "    test_some.py::test_needs_a_tool",
        ]
    )
    assert "no CUDA device on this machine (1):" not in result.stdout.str()


def test_allowed_skips_alone_pass(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(STRICT_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        def test_int8():
            pytest.skip("Int8Convs run only with oneDNN, torch._int_mm and a CPU with VNNI or AMX")

        def test_passes():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    assert "unexpected skip" not in result.stdout.str()


@pytest.mark.worker_errors_expected  # the inner run's bridge is made while this test's guard watches too
def test_a_bridge_whose_worker_failed_fails_its_test_unless_marked(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.conftest import bridge_worker_errors_fail, pytest_configure  # noqa: F401")
    pytester.makepyfile(
        """
        import pytest

        from asr_gateway.bridge import CallBridge
        from tests.bridge_fakes import FakeEngine, RecordingPublisher, bare_processor
        from tests.test_cucm_join import call, leg

        class FailingPublisher(RecordingPublisher):
            def call_started(self, ctx, participants, metadata=None, source="sip"):
                raise RuntimeError("a bug in the publisher")

        def failed_bridge():
            bridge = CallBridge(FakeEngine(), bare_processor(), FailingPublisher())
            bridge.start()
            bridge.open_leg(call("a", None), leg("a", "mixed"))  # no event loop: announced at once
            bridge.stop()
            return bridge

        def test_unmarked():
            assert failed_bridge().worker_errors == 1

        @pytest.mark.worker_errors_expected
        def test_marked():
            assert failed_bridge().worker_errors == 1
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_unmarked*", "*a CallBridge's worker failed 1 time(s)*"])
