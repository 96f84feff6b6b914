"""Is a model directory the bundled demo model? Said where a user meets the model.

The bundled model (``asr_core/demo_model``) was trained on synthetic espeak-ng voices only and
reads almost nothing of a person's speech (CER about 99 % on real recordings, README). Its
directory holds a marker file, ``DEMO``; a model installed by ``asr-model pull``/``install``
has none, and a copy of the demo model elsewhere keeps it, so the check is the file, not the path.
"""

from __future__ import annotations

from pathlib import Path

BUNDLED_MODEL_DIR = Path(__file__).resolve().parents[1] / "demo_model"
"""The demo model shipped in the package: what the service serves when ``engine.model_dir`` is unset."""

DEMO_MARKER = "DEMO"
"""File in a model directory that marks it as the synthetic-voices demo model."""

DEMO_MODEL_NOTICE = (
    "This is the bundled demo model: it was trained on synthetic (espeak-ng) voices only and will not "
    "understand a person speaking (CER about 99 % on real speech). For real accuracy install a WeNet U2++ "
    "model trained on real speech: asr-model pull NAME (asr-model list names them), or offline "
    "asr-model install ARCHIVE; then point engine.model_dir (or --model) at it (docs/models.md)."
)
"""One paragraph that the console, the demo's summary and ``asr-model check`` show."""


def is_demo_model(model_dir: Path) -> bool:
    """True when ``model_dir`` holds the demo model's marker file."""
    return (model_dir / DEMO_MARKER).is_file()
