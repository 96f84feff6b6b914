"""Streaming the fixture model through a KvPool reproduces WeNet's chunk-by-chunk outputs.

Four streams share one pool (window = chunk * left_chunks per stream, so windows of 8 and 64
frames side by side); each step batches the streams whose next fbank window has the same
length, gathers their caches, runs one `forward_chunk_batch`, and ring-writes the new frames.
Each slot streams both utterances back to back with a reset (an endpoint) between them; the
second stream of each setting plays them in the other order and starts a few steps later,
so batches mix streams at different offsets and cache fill levels.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from kv_ring import KvPool

torch.set_num_threads(1)

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
if not (FIXTURE / "expected.npz").exists():
    pytest.skip(f"WeNet fixture not found at {FIXTURE}", allow_module_level=True)
loader = pytest.importorskip("asr_core.model.loader", reason="asr_core.model (the WeNet model) has not landed yet")

UTTERANCES = ("utt1", "utt2")
# (chunk frames C, left chunks, utterance order, steps to wait before starting)
SETTINGS = ((4, 2, UTTERANCES, 0), (16, 4, UTTERANCES, 0), (4, 2, UTTERANCES[::-1], 3), (16, 4, UTTERANCES[::-1], 1))


@dataclass
class Job:
    """One stream: a slot that plays the fixture utterances back to back."""

    slot: int
    chunk: int
    left_chunks: int
    subsampling: int
    context: int
    order: tuple[str, ...]
    delay: int
    utterance: int = 0
    start: int = 0  # first fbank frame of the next chunk
    offset: int = 0  # encoder frames emitted for the current utterance
    outputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"c{self.chunk}_l{self.left_chunks}"


def next_window(job: Job, fbank: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The fbank frames of the job's next chunk, WeNet's forward_chunk_by_chunk windows."""
    if job.utterance == len(job.order):
        return None
    if job.delay > 0:
        job.delay -= 1
        return None
    feats = fbank[job.order[job.utterance]]
    window = (job.chunk - 1) * job.subsampling + job.context
    return feats[job.start : min(job.start + window, feats.size(0))]


def test_pooled_streaming_equals_wenet_chunk_by_chunk() -> None:
    expected = np.load(FIXTURE / "expected.npz")
    loaded = loader.load_wenet_model(FIXTURE / "model")
    model = loaded.model
    fbank = {utt: torch.from_numpy(expected[f"{utt}__fbank"]) for utt in UTTERANCES}
    context = loaded.right_context + 1
    pool = KvPool(len(SETTINGS), loaded.cache_geometry(max(c * left for c, left, _, _ in SETTINGS)))
    jobs = [
        Job(pool.allocate(c * left), c, left, loaded.subsampling, context, order, delay)
        for c, left, order, delay in SETTINGS
    ]
    batch_sizes = []
    with torch.inference_mode():
        while True:
            groups: dict[int, list[tuple[Job, torch.Tensor]]] = {}
            for job in jobs:
                xs = next_window(job, fbank)
                if xs is not None:
                    groups.setdefault(xs.size(0), []).append((job, xs))
            if not groups and all(job.utterance == len(job.order) for job in jobs):
                break
            for members in groups.values():
                batch_sizes.append(len(members))
                slots = torch.tensor([job.slot for job, _ in members])
                offsets = torch.tensor([job.offset for job, _ in members])
                view = pool.gather(slots)
                ys, new_kv, new_cnn = model.encoder.forward_chunk_batch(
                    torch.stack([xs for _, xs in members]), offsets, view.att, view.pos, view.mask, view.cnn
                )
                positions = offsets.unsqueeze(1) + torch.arange(ys.size(1))  # (B, C)
                pool.write(slots, new_kv, positions, new_cnn)
                for b, (job, _) in enumerate(members):
                    job.outputs.setdefault(job.order[job.utterance], []).append(ys[b])
                    job.start += job.chunk * job.subsampling
                    job.offset += ys.size(1)
                    if job.start > fbank[job.order[job.utterance]].size(0) - context:
                        job.utterance += 1
                        job.start = job.offset = 0
                        pool.reset(job.slot)
    assert max(batch_sizes) == 2
    for job in jobs:
        for utt in UTTERANCES:
            got = torch.cat(job.outputs[utt])  # (T_enc, D)
            want = torch.from_numpy(expected[f"{utt}__encoder_out_stream_{job.name}"])
            assert got.shape == want.shape, (job.name, utt)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4, msg=f"{utt} {job.name}")
            if job.name == "c4_l2":
                want_logp = torch.from_numpy(expected[f"{utt}__ctc_logprobs_stream_c4_l2"])
                logp = model.ctc_log_probs(got.unsqueeze(0))[0]
                torch.testing.assert_close(logp, want_logp, rtol=0, atol=1e-3, msg=f"{utt} log-probs")
