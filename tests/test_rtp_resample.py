import asyncio
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import soxr
from hypothesis import given, settings
from hypothesis import strategies as st

import rtp.resample as resample
from rtp import g711
from rtp.leg import RtpLeg
from rtp.resample import (
    TAP_FRACTION_BITS,
    TAPS_PER_SIDE,
    SharedUpsampler,
    SoxrStream,
    Upsampler,
    fixed_point_taps,
    halfband_taps,
)
from rtp.sink import CountingSink

NATIVE = resample._native_upsample_rows


@pytest.fixture(
    scope="module",
    autouse=True,
    params=[
        "numpy",
        pytest.param("native", marks=pytest.mark.skipif(NATIVE is None, reason="rtp._fastrtp is not built")),
    ],
)
def upsampler_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test here runs on the numpy product and, where built, on the C loop."""
    saved = resample._native_upsample_rows
    resample._native_upsample_rows = NATIVE if request.param == "native" else None
    try:
        yield request.param
    finally:
        resample._native_upsample_rows = saved


def tone(hz: float, samples: int, rate: int = 8000, amplitude: float = 12000) -> np.ndarray:
    return (np.sin(2 * np.pi * hz * np.arange(samples) / rate) * amplitude).astype(np.int16)


def upsample_in_pieces(x: np.ndarray, sizes: list[int]) -> np.ndarray:
    upsampler = Upsampler()
    pieces = []
    start = 0
    for size in sizes:
        out = upsampler.process(x[start : start + size])
        assert out.dtype == np.int16
        pieces.append(out)
        start += size
    pieces.append(upsampler.process(x[start:]))
    pieces.append(upsampler.flush())
    return np.concatenate(pieces)


def level_db(y: np.ndarray, hz: float, rate: int = 16000) -> float:
    """Level of the component at `hz` (an exact FFT bin) relative to a 12000-peak sine."""
    spectrum = np.abs(np.fft.rfft(y.astype(np.float64))) * 2 / len(y)
    return float(20 * np.log10(spectrum[round(hz * len(y) / rate)] / 12000 + 1e-12))


@pytest.mark.parametrize("seed", range(5))
def test_pieces_of_any_size_give_exactly_the_same_samples(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(8000) * 4000).astype(np.int16)
    whole = upsample_in_pieces(x, [])
    sizes = [int(s) for s in rng.integers(0, 400, size=40)]
    pieced = upsample_in_pieces(x, sizes)
    assert len(whole) == len(pieced) == 16000
    np.testing.assert_array_equal(whole, pieced)


def integer_reference(x: np.ndarray) -> np.ndarray:
    """The upsampler's output computed with int64 arithmetic only (no BLAS, no floats in the
    sums): what every CPU must produce bit for bit."""
    taps = fixed_point_taps(halfband_taps())
    history, tail = np.zeros(2 * TAPS_PER_SIDE - 1, np.int64), np.zeros(TAPS_PER_SIDE, np.int64)
    padded = np.concatenate([history, x.astype(np.int64), tail])
    odd_sums = np.correlate(padded, taps, mode="valid")[TAPS_PER_SIDE:]
    odd = np.clip(np.rint(odd_sums.astype(np.float64) * 2.0**-TAP_FRACTION_BITS), -32768, 32767)
    out = np.empty(2 * len(x), dtype=np.int16)
    out[0::2] = x
    out[1::2] = odd
    return out


class ManualLoop:
    """Stands in for the event loop: the shared upsampler's batch runs when the test says."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def call_soon(self, callback: Callable[[], None]) -> object:
        self.callbacks.append(callback)
        return object()

    def run_pending(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


int16_signals = st.lists(st.integers(-32768, 32767), min_size=0, max_size=600).map(lambda v: np.array(v, np.int16))


@settings(max_examples=60, deadline=None)
@given(
    signals=st.lists(int16_signals, min_size=1, max_size=5),
    cuts=st.lists(st.integers(0, 200), min_size=0, max_size=30),
    passes=st.lists(st.booleans(), min_size=0, max_size=30),
)
def test_any_piece_sizes_and_any_batching_give_the_integer_reference(
    signals: list[np.ndarray], cuts: list[int], passes: list[bool]
) -> None:
    """Property: streams cut into any pieces, batched with each other in any way (a batch runs
    after some submits, not others), give exactly the int64 reference, so the float64
    product's result does not depend on the row count or the BLAS kernel that ran it."""
    loop = ManualLoop()
    shared = SharedUpsampler(loop)  # type: ignore[arg-type]
    outputs: list[list[np.ndarray]] = [[] for _ in signals]
    streams = [shared.stream(out.append) for out in outputs]
    starts = [0] * len(signals)
    for step, cut in enumerate(cuts):
        index = step % len(signals)
        signal = signals[index]
        streams[index].submit(signal[starts[index] : starts[index] + cut])
        starts[index] += cut
        if step < len(passes) and passes[step]:
            loop.run_pending()
    for index, stream in enumerate(streams):
        stream.submit(signals[index][starts[index] :])
    loop.run_pending()
    for stream in streams:
        stream.flush()
    for signal, out in zip(signals, outputs, strict=True):
        got = np.concatenate(out) if out else np.zeros(0, np.int16)
        np.testing.assert_array_equal(got, integer_reference(signal))


def test_full_scale_input_stays_exact_and_clips() -> None:
    """The largest sums an int16 signal can make (alternating full scale against the taps'
    signs) are still exact and clip to int16."""
    taps = fixed_point_taps(halfband_taps())
    worst = np.where(taps > 0, 32767, -32768).astype(np.int16)
    x = np.tile(np.concatenate([worst, -worst.astype(np.int32).clip(-32768, 32767).astype(np.int16)]), 20)
    np.testing.assert_array_equal(upsample_in_pieces(x, [7, 160, 33] * 10), integer_reference(x))


def test_even_outputs_are_the_input_samples_without_delay() -> None:
    x = (np.random.default_rng(1).standard_normal(1000) * 3000).astype(np.int16)
    y = upsample_in_pieces(x, [160] * 5)
    np.testing.assert_array_equal(y[0::2], x)
    impulse = np.zeros(200, dtype=np.int16)
    impulse[100] = 16384
    response = upsample_in_pieces(impulse, [])
    # Symmetric about the impulse (linear phase, no added delay): odd outputs 199-2k and 201+2k match.
    left, right = response[199 : 199 - 2 * TAPS_PER_SIDE : -2], response[201 : 201 + 2 * TAPS_PER_SIDE : 2]
    np.testing.assert_array_equal(left, right)
    assert int(response[200]) == 16384


def test_taps_sum_to_one_and_are_symmetric() -> None:
    taps = halfband_taps()
    assert len(taps) == 2 * TAPS_PER_SIDE
    assert abs(taps.sum() - 1) < 1e-12
    np.testing.assert_allclose(taps, taps[::-1])
    fixed = fixed_point_taps(taps)
    np.testing.assert_array_equal(fixed, fixed[::-1])
    assert abs(int(fixed.sum()) - 2**TAP_FRACTION_BITS) <= len(fixed)


def test_taps_too_fine_for_exact_float64_sums_are_refused() -> None:
    with pytest.raises(ValueError, match="2\\^53"):
        fixed_point_taps(halfband_taps(), fraction_bits=40)


def test_telephone_band_passes_flat_and_images_are_rejected() -> None:
    for hz in (300, 1000, 3000, 3400):
        y = upsample_in_pieces(tone(hz, 8000), [160] * 49)
        assert abs(level_db(y, hz)) < 0.01, hz
        # The spectral image of a tone at f sits at 8000 - f after upsampling by 2.
        assert level_db(y, 8000 - hz) < -80, hz


def test_close_to_soxr_on_band_limited_speech_like_signal() -> None:
    rng = np.random.default_rng(7)
    x = sum(tone(hz, 8000, amplitude=2500) for hz in rng.uniform(200, 3300, size=8)).astype(np.int16)
    ours = upsample_in_pieces(x, [160] * 49).astype(np.float64)
    reference = soxr.resample(x, 8000, 16000, quality="HQ").astype(np.float64)
    body = slice(2000, -2000)
    error = ours[body] - reference[body]
    snr = 10 * np.log10(np.sum(reference[body] ** 2) / np.sum(error**2))
    assert snr > 60


def test_process_after_flush_is_an_error() -> None:
    upsampler = Upsampler()
    upsampler.flush()
    assert len(upsampler.flush()) == 0
    with pytest.raises(RuntimeError, match="after flush"):
        upsampler.process(np.zeros(160, dtype=np.int16))


def test_short_signal_and_flush_keep_the_length() -> None:
    for n in (0, 1, 5, TAPS_PER_SIDE, 3 * TAPS_PER_SIDE + 1):
        x = (np.arange(n) * 97 % 2000 - 1000).astype(np.int16)
        y = upsample_in_pieces(x, [1] * min(n, 7))
        assert len(y) == 2 * n
        np.testing.assert_array_equal(y[0::2], x)


def test_shared_upsampler_batches_streams_of_any_piece_sizes_on_the_loop() -> None:
    """Streams that submit in the same loop pass share one run, whatever their piece sizes;
    each stream's output equals a lone upsampler's, and nothing runs before the loop does."""
    rng = np.random.default_rng(3)
    signals = [(rng.standard_normal(4000) * 3000).astype(np.int16) for _ in range(6)]
    cuts = [sorted(int(c) for c in rng.integers(1, 4000, size=12)) for _ in signals]

    async def scenario() -> list[np.ndarray]:
        shared = SharedUpsampler.for_loop(asyncio.get_running_loop())
        assert SharedUpsampler.for_loop(asyncio.get_running_loop()) is shared
        outputs: list[list[np.ndarray]] = [[] for _ in signals]
        streams = [shared.stream(out.append) for out in outputs]
        for step in range(13):
            for stream, signal, cut in zip(streams, signals, cuts, strict=True):
                edges = [0, *cut, len(signal)]
                stream.submit(signal[edges[step] : edges[step + 1]])
            if step == 0:
                assert not any(outputs)  # queued, not run: the loop runs the batch
            await asyncio.sleep(0)
            assert not shared._waiting
        for stream in streams:
            stream.flush()
        return [np.concatenate(out) for out in outputs]

    for got, signal in zip(asyncio.run(scenario()), signals, strict=True):
        np.testing.assert_array_equal(got, upsample_in_pieces(signal, []))


def test_a_failing_consumer_loses_only_its_own_output(caplog: pytest.LogCaptureFixture) -> None:
    shared = SharedUpsampler()
    good: list[np.ndarray] = []

    def broken(_: np.ndarray) -> None:
        raise RuntimeError("sink is gone")

    shared.stream(broken).submit(np.ones(160, dtype=np.int16))
    ok = shared.stream(good.append)
    ok.submit(np.ones(160, dtype=np.int16))
    ok.flush()
    assert sum(len(piece) for piece in good) == 320
    assert "its output for this batch is lost" in caplog.text


def test_soxr_stream_keeps_the_interface() -> None:
    out: list[np.ndarray] = []
    stream = SoxrStream(out.append)
    for piece in np.split(tone(440, 8000), 50):
        stream.submit(piece)
    stream.flush()
    stream.flush()
    assert sum(len(piece) for piece in out) == 16000
    with pytest.raises(RuntimeError, match="after flush"):
        stream.submit(np.zeros(160, dtype=np.int16))


def test_leg_rejects_an_unknown_resampler() -> None:
    with pytest.raises(ValueError, match="unknown resampler 'sinc'"):
        RtpLeg(sink=CountingSink(), payload_types={0: "PCMU"}, resampler="sinc")


def test_g711_pieces_are_decoded_in_the_batch() -> None:
    """Streams submitting G.711 bytes (both laws, in the same pass) and decoded PCM, mixed
    within a stream too, get what a lone upsampler gives on the decoded samples."""
    rng = np.random.default_rng(11)
    laws = ["PCMU", "PCMA", "PCMU", "PCMA"]
    signals = [(rng.standard_normal(3200) * 3000).astype(np.int16) for _ in laws]
    coded = [g711.encode(law, signal) for law, signal in zip(laws, signals, strict=True)]
    decoded = [g711.decode(law, data) for law, data in zip(laws, coded, strict=True)]

    async def scenario() -> list[np.ndarray]:
        shared = SharedUpsampler.for_loop(asyncio.get_running_loop())
        outputs: list[list[np.ndarray]] = [[] for _ in laws]
        streams = [shared.stream(out.append) for out in outputs]
        for start in range(0, 3200, 640):
            for index, stream in enumerate(streams):
                piece = slice(start, start + 640)
                if (start // 640 + index) % 3 == 2:
                    stream.submit(decoded[index][piece])
                else:
                    table = g711.DECODE_TABLES[laws[index]]
                    stream.submit_g711(coded[index][piece][:320], table)
                    stream.submit_g711(coded[index][piece][320:], table)
            await asyncio.sleep(0)
        for stream in streams:
            stream.flush()
        return [np.concatenate(out) for out in outputs]

    for got, samples in zip(asyncio.run(scenario()), decoded, strict=True):
        np.testing.assert_array_equal(got, upsample_in_pieces(samples, []))
