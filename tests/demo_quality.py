"""Is the bundled demo model good enough for tests that check transcripts?

End-to-end tests always check the plumbing (calls, events, ordering, roles); they check
transcripts, KB suggestions and tags only when the bundled model recognizes the seed
sentence. ``tests/test_demo_model.py`` reports the model's state either way.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from asr_core.audio_io import read_wav
from asr_core.ctc_search import ctc_prefix_beam_search
from asr_core.frontend import compute_fbank
from asr_core.model.loader import load_wenet_model
from asr_core.offline import encode_streaming

REPO = Path(__file__).resolve().parents[1]
DEMO_MODEL = REPO / "asr_core" / "demo_model"
SEED_WAV = REPO / "tests" / "data" / "hotline_8k" / "hotline_seed.wav"
SEED_TEXT = "我今天发现新华路十二号井盖发生了破损有安全隐患"
GOOD_ENOUGH_CER = 0.15


def cer(hyp: str, ref: str) -> float:
    row = np.arange(len(ref) + 1)
    for i, h in enumerate(hyp, 1):
        previous, row[0] = row[0], i
        for j, r in enumerate(ref, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (h != r))
    return float(row[len(ref)]) / max(1, len(ref))


@functools.cache
def seed_transcript() -> str:
    """The demo model's 320 ms streaming CTC best path for the seed sentence ('' without a model)."""
    if not (DEMO_MODEL / "final.pt").is_file():
        return ""
    loaded = load_wenet_model(DEMO_MODEL)
    fbank = torch.from_numpy(compute_fbank(read_wav(SEED_WAV).samples))
    encoder_out, _ = encode_streaming(loaded, fbank, 8, 4)
    log_probs = loaded.model.ctc_log_probs(encoder_out.unsqueeze(0))[0]
    best = ctc_prefix_beam_search(log_probs, beam=10)[0].tokens
    return "".join(loaded.units[t] for t in best if not loaded.units[t].startswith("<"))


def demo_model_is_accurate() -> bool:
    return cer(seed_transcript(), SEED_TEXT) <= GOOD_ENOUGH_CER
