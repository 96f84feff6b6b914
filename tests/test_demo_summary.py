"""``asr-gateway demo``'s summary says plainly when the bundled synthetic-voices model served the
calls (its CER 0.0 % is of voices like its training's) and how to install a real model; a model
without the demo marker gets no such note."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

from asr_core.model.bundled import BUNDLED_MODEL_DIR, DEMO_MARKER
from asr_gateway.dev.demo import DemoReport, print_summary


def summary_of(report: DemoReport) -> str:
    out = io.StringIO()
    print_summary(report, out)
    return out.getvalue()


def test_the_summary_names_the_demo_model_and_how_to_install_a_real_one(tmp_path: Path) -> None:
    report = DemoReport(calls=[], wall_s=1.0, model_dir=str(BUNDLED_MODEL_DIR), redis="127.0.0.1:6379")
    text = summary_of(report)
    note = " ".join(text[text.index("note: ") : text.index("demo ok")].split())  # wrapped at 100 columns
    assert all(len(line) <= 100 for line in text[text.index("note: ") :].splitlines())
    assert "will not understand a person speaking" in note
    assert "asr-model pull NAME" in note and "asr-model install ARCHIVE" in note
    assert json.loads(json.dumps(report.to_json()))["model_notice"] in note

    real = tmp_path / "real_model"
    real.mkdir()
    other = DemoReport(calls=[], wall_s=1.0, model_dir=str(real), redis="127.0.0.1:6379")
    assert "note: " not in summary_of(other) and other.to_json()["model_notice"] is None
    shutil.copy(BUNDLED_MODEL_DIR / DEMO_MARKER, real / DEMO_MARKER)  # a copy of the demo model elsewhere
    assert "note: " in summary_of(other)
