"""Finals searched in a child process equal finals searched in-thread, and survive the child dying."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from asr_core.audio_io import read_wav
from asr_core.ctc_search import ctc_topk
from asr_core.finals import FinalRequest, FinalResult, FinalSearch, FinalSettings, ProcessFinalSearch
from asr_core.frontend import compute_fbank
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.offline import encode_streaming

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"WeNet fixture not found at {FIXTURE}")


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(FIXTURE / "model")


@pytest.fixture(scope="module")
def requests(loaded: LoadedModel) -> list[FinalRequest]:
    """Both fixture utterances at two chunk sizes; one of them without rescoring."""
    out = []
    for name in ("utt1.wav", "utt2.wav"):
        fbank = torch.from_numpy(compute_fbank(read_wav(FIXTURE / "wav" / name).samples))
        for chunk_frames in (4, 16):
            encoder_out, _ = encode_streaming(loaded, fbank, chunk_frames, 4)
            values, ids = ctc_topk(loaded.model.ctc_log_probs(encoder_out.unsqueeze(0))[0], 10)
            out.append(FinalRequest(values, ids, encoder_out))
    out.append(FinalRequest(out[0].topk_values, out[0].topk_ids, None))
    return out


def settings(loaded: LoadedModel) -> FinalSettings:
    return FinalSettings(10, loaded.blank_id, loaded.sos_id, loaded.eos_id, 0.5, 0.3)


def assert_same(got: list[FinalResult], expected: list[FinalResult]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert [(h.tokens, h.times) for h in a.nbest] == [(h.tokens, h.times) for h in b.nbest]
        np.testing.assert_allclose([h.score for h in a.nbest], [h.score for h in b.nbest], rtol=0, atol=1e-9)
        assert (a.rescored is None) == (b.rescored is None)
        if a.rescored is not None and b.rescored is not None:
            assert a.rescored.tokens == b.rescored.tokens
            assert a.rescored.score == pytest.approx(b.rescored.score, abs=1e-4)
            assert [h.nbest_index for h in a.rescored.hypotheses] == [h.nbest_index for h in b.rescored.hypotheses]


@pytest.mark.parametrize("backend", ["torch", "torch-int8"])
def test_process_search_equals_thread_search(loaded: LoadedModel, requests: list[FinalRequest], backend: str) -> None:
    from asr_core.backends import rescoring_decoder

    local = FinalSearch(rescoring_decoder(backend, loaded.model.decoder), settings(loaded))
    remote = ProcessFinalSearch(loaded.model.decoder, backend, local)
    try:
        assert remote.pid is not None and remote.pid != os.getpid()
        expected = local.run(requests)
        assert expected[-1].rescored is None and expected[0].rescored is not None
        assert_same(remote.run(requests), expected)
        reduced = settings(loaded).reduced(beam=2)  # surge: per batch, sent with it
        assert (reduced.beam, reduced.attention_beam) == (2, 0)
        narrow = local.run(requests, reduced)
        assert max(len(r.nbest) for r in narrow) <= 2 < max(len(r.nbest) for r in expected)
        assert_same(remote.run(requests, reduced), narrow)
        assert (remote.cpu_seconds() or 0.0) > 0.0
        if os.path.exists("/proc/self/schedstat"):  # per-thread run times in ns, not 10 ms clock ticks
            seconds = remote.cpu_seconds() or 0.0
            assert seconds * 100 != int(seconds * 100)
    finally:
        remote.close()
    assert remote.pid is None


def test_a_dead_child_is_replaced_and_its_batch_still_answered(
    loaded: LoadedModel, requests: list[FinalRequest]
) -> None:
    local = FinalSearch(loaded.model.decoder, settings(loaded))
    remote = ProcessFinalSearch(loaded.model.decoder, "torch", local)
    try:
        first_pid = remote.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        assert_same(remote.run(requests), local.run(requests))  # answered in-thread meanwhile
        assert remote.restarts == 1 and remote.pid not in (None, first_pid)
        assert_same(remote.run(requests[:1]), local.run(requests[:1]))  # and by the new child
    finally:
        remote.close()


def nice_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19: nice


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads nice values from /proc (Linux)")
@pytest.mark.parametrize("niceness", [0, 7])
def test_the_child_runs_at_the_configured_niceness(loaded: LoadedModel, niceness: int) -> None:
    """``engine.finals_niceness``: added to the service's own nice value in the child only."""
    local = FinalSearch(loaded.model.decoder, settings(loaded))
    remote = ProcessFinalSearch(loaded.model.decoder, "torch", local, niceness)
    try:
        assert remote.pid is not None
        assert nice_of(remote.pid) == min(19, nice_of(os.getpid()) + niceness)
    finally:
        remote.close()
    with pytest.raises(ValueError, match="finals niceness must be 0-19"):
        ProcessFinalSearch(loaded.model.decoder, "torch", local, 20)


def test_a_streams_own_attention_beam_overrides_the_engines(loaded: LoadedModel, requests: list[FinalRequest]) -> None:
    """A route's ``attention_beam`` (joint finals) reaches the search per request: those requests
    get what a search with that beam for everyone gives, the others the engine's (rescore), also
    through the child process."""
    from dataclasses import replace

    rescore = FinalSettings.for_model(loaded, beam=10, ctc_weight=0.5, reverse_weight=0.3)
    joint = replace(rescore, attention_beam=4)
    mixed = [replace(r, attention_beam=4) if i % 2 else r for i, r in enumerate(requests)]
    plain = FinalSearch(loaded.model.decoder, rescore).run(requests)
    proposed = FinalSearch(loaded.model.decoder, joint).run(requests)
    expected = [proposed[i] if i % 2 else plain[i] for i in range(len(requests))]
    sizes = [
        (len(p.rescored.hypotheses), len(j.rescored.hypotheses))
        for p, j in zip(plain, proposed, strict=True)
        if p.rescored and j.rescored
    ]
    assert any(joint_size > plain_size for plain_size, joint_size in sizes)  # the proposals are there
    local = FinalSearch(loaded.model.decoder, rescore)
    assert_same(local.run(mixed), expected)
    opted_out = [replace(r, attention_beam=0) for r in requests]
    assert_same(FinalSearch(loaded.model.decoder, joint).run(opted_out), plain)
    remote = ProcessFinalSearch(loaded.model.decoder, "torch", local)
    try:
        assert_same(remote.run(mixed), expected)
    finally:
        remote.close()
