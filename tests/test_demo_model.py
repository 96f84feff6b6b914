"""The bundled demo model: it loads with the WeNet loader and (issue 7) should transcribe the
held-out telephone recording of the seed sentence exactly."""

from __future__ import annotations

import pytest

from asr_core.model.loader import load_wenet_model
from tests.demo_quality import DEMO_MODEL, SEED_TEXT, cer, demo_model_is_accurate, seed_transcript

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "final.pt").is_file(), reason="no bundled demo model")


def test_demo_model_loads_like_any_wenet_model() -> None:
    loaded = load_wenet_model(DEMO_MODEL)
    assert loaded.vocab_size == len(loaded.units) > 2000
    assert sum(f.stat().st_size for f in DEMO_MODEL.iterdir()) <= 20 * 2**20


def test_demo_model_transcribes_the_seed_sentence() -> None:
    text = seed_transcript()
    if not demo_model_is_accurate():
        pytest.xfail(f"the bundled demo model is under-trained (issue 7): CER {cer(text, SEED_TEXT):.0%}, got {text!r}")
    assert text == SEED_TEXT
