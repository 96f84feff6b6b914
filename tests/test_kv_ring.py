"""KvPool: ring semantics against WeNet's truncation, batching, slot lifecycle, memory."""

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asr_common.errors import CapacityError
from kv_ring import CacheGeometry, KvPool, PoolExhausted, SlotStateError, plan_pool

torch.set_num_threads(1)

LAYERS, HEADS, D_K, WINDOW, D_MODEL, CNN = 2, 2, 3, 12, 4, 3


def make_pool(num_slots: int = 4, window: int = WINDOW) -> KvPool:
    return KvPool(num_slots, CacheGeometry(LAYERS, HEADS, D_K, window, D_MODEL, CNN))


def random_chunk(batch: int, chunk: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    new_kv = torch.randn(LAYERS, batch, HEADS, chunk, 2 * D_K, generator=generator)
    new_cnn = torch.randn(LAYERS, batch, D_MODEL, CNN, generator=generator)
    return new_kv, new_cnn


def valid_frames(pool: KvPool, slot: int) -> dict[int, torch.Tensor]:
    """{position: (L, H, 2*d_k)} of the frames the gather marks valid for one slot."""
    view = pool.gather(torch.tensor([slot]))
    return {int(view.pos[0, w]): view.att[:, 0, :, w] for w in range(pool.window) if bool(view.mask[0, w])}


class Reference:
    """WeNet's cache semantics: concatenate all history, keep the last `window` frames."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.history: list[torch.Tensor] = []  # (L, H, 2*d_k) per frame, position = list index
        self.cnn = torch.zeros(LAYERS, D_MODEL, CNN)

    def write(self, kv: torch.Tensor, cnn: torch.Tensor) -> None:
        """kv (L, H, n, 2*d_k) of n new frames; cnn (L, D, K-1)."""
        self.history.extend(kv.unbind(2))
        self.cnn = cnn

    def cache(self) -> dict[int, torch.Tensor]:
        start = max(0, len(self.history) - self.window)
        return {p: self.history[p] for p in range(start, len(self.history))}


def assert_matches(pool: KvPool, slot: int, reference: Reference) -> None:
    got, want = valid_frames(pool, slot), reference.cache()
    assert sorted(got) == sorted(want)
    for position, frame in want.items():
        torch.testing.assert_close(got[position], frame, rtol=0, atol=0)
    view = pool.gather(torch.tensor([slot]))
    torch.testing.assert_close(view.cnn[:, 0], reference.cnn, rtol=0, atol=0)
    assert bool((view.pos[~view.mask] == -1).all())
    assert pool.frames_written(slot) == len(reference.history)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_ring_keeps_exactly_the_last_window_frames(data: st.DataObject) -> None:
    num_streams = data.draw(st.integers(1, 4), label="streams")
    windows = data.draw(st.lists(st.integers(1, WINDOW), min_size=num_streams, max_size=num_streams), label="windows")
    pool = make_pool(num_slots=6)
    slots = [pool.allocate(w) for w in windows]
    references = {slot: Reference(w) for slot, w in zip(slots, windows, strict=True)}
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        batch = data.draw(st.lists(st.sampled_from(slots), min_size=1, unique=True), label="batch")
        if data.draw(st.integers(0, 9), label="reset?") == 0:
            pool.reset(batch[0])
            references[batch[0]] = Reference(references[batch[0]].window)
            continue
        chunk = data.draw(st.integers(1, min(references[s].window for s in batch)), label="chunk")
        ragged = data.draw(st.booleans(), label="ragged")
        lengths = [data.draw(st.integers(0, chunk)) if ragged else chunk for _ in batch]
        offsets = torch.tensor([len(references[s].history) for s in batch])
        positions = offsets.unsqueeze(1) + torch.arange(chunk)  # (B, C)
        new_kv, new_cnn = random_chunk(len(batch), chunk, generator)
        pool.write(torch.tensor(batch), new_kv, positions, new_cnn, torch.tensor(lengths) if ragged else None)
        for b, slot in enumerate(batch):
            references[slot].write(new_kv[:, b, :, : lengths[b]], new_cnn[:, b])
    for slot, reference in references.items():
        assert_matches(pool, slot, reference)


def test_batched_write_and_gather_equal_per_slot_operations() -> None:
    generator = torch.Generator().manual_seed(0)
    windows = [4, 8, 12, 6, 9]
    batched, single = make_pool(num_slots=5), make_pool(num_slots=5)
    slots = [batched.allocate(w) for w in windows]
    assert slots == [single.allocate(w) for w in windows]
    index = torch.tensor(slots)
    for step in range(7):
        chunk = 1 + step % 4
        new_kv, new_cnn = random_chunk(len(slots), chunk, generator)
        positions = (step * 4 + torch.arange(chunk)).expand(len(slots), chunk).contiguous()
        batched.write(index, new_kv, positions, new_cnn)
        for b, slot in enumerate(slots):
            single.write(torch.tensor([slot]), new_kv[:, b : b + 1], positions[b : b + 1], new_cnn[:, b : b + 1])
    together = batched.gather(index)
    for b, slot in enumerate(slots):
        alone = single.gather(torch.tensor([slot]))
        assert torch.equal(together.att[:, b], alone.att[:, 0])
        assert torch.equal(together.pos[b], alone.pos[0])
        assert torch.equal(together.mask[b], alone.mask[0])
        assert torch.equal(together.cnn[:, b], alone.cnn[:, 0])
    shuffled = torch.tensor(slots[::-1])
    reversed_view = batched.gather(shuffled)
    assert torch.equal(reversed_view.att, together.att.flip(1))
    assert reversed_view.att.shape == (LAYERS, len(slots), HEADS, WINDOW, 2 * D_K)
    assert reversed_view.mask.dtype == torch.bool


def test_mask_covers_unwritten_frames_and_frames_beyond_the_slot_window() -> None:
    pool = make_pool()
    slot = pool.allocate(5)
    view = pool.gather(torch.tensor([slot]))
    assert not bool(view.mask.any())
    assert bool((view.pos == -1).all())
    new_kv, new_cnn = random_chunk(1, 3, torch.Generator().manual_seed(1))
    pool.write(torch.tensor([slot]), new_kv, torch.arange(3).unsqueeze(0), new_cnn)
    view = pool.gather(torch.tensor([slot]))
    assert view.mask[0].tolist() == [True] * 3 + [False] * (WINDOW - 3)
    pool.write(torch.tensor([slot]), new_kv, torch.arange(3, 6).unsqueeze(0), new_cnn)
    view = pool.gather(torch.tensor([slot]))
    assert view.mask[0].tolist() == [True] * 5 + [False] * (WINDOW - 5)
    assert view.pos[0, :5].tolist() == [5, 1, 2, 3, 4]


def test_positions_that_skip_ahead_mask_frames_older_than_the_window() -> None:
    pool = make_pool()
    slot = pool.allocate(6)
    new_kv, new_cnn = random_chunk(1, 2, torch.Generator().manual_seed(2))
    pool.write(torch.tensor([slot]), new_kv, torch.tensor([[0, 1]]), new_cnn)
    pool.write(torch.tensor([slot]), new_kv, torch.tensor([[8, 9]]), new_cnn)
    assert sorted(valid_frames(pool, slot)) == [8, 9]


def test_released_slot_is_reused_empty_and_reset_clears_history() -> None:
    pool = make_pool(num_slots=2)
    slot = pool.allocate(4)
    new_kv, new_cnn = random_chunk(1, 4, torch.Generator().manual_seed(3))
    pool.write(torch.tensor([slot]), new_kv, torch.arange(4).unsqueeze(0), new_cnn)
    assert len(valid_frames(pool, slot)) == 4
    pool.reset(slot)
    assert valid_frames(pool, slot) == {}
    assert pool.frames_written(slot) == 0
    assert pool.window_of(slot) == 4
    assert not bool(pool.gather(torch.tensor([slot])).cnn.any())
    pool.write(torch.tensor([slot]), new_kv, torch.arange(4).unsqueeze(0), new_cnn)
    pool.release(slot)
    again = pool.allocate(WINDOW)
    assert again == slot
    assert pool.window_of(again) == WINDOW
    view = pool.gather(torch.tensor([again]))
    assert not bool(view.mask.any())
    assert not bool(view.att.any())
    assert not bool(view.cnn.any())


def test_lifecycle_errors() -> None:
    pool = make_pool(num_slots=2)
    first, second = pool.allocate(1), pool.allocate(WINDOW)
    assert (pool.used_slots, pool.free_slots) == (2, 0)
    with pytest.raises(PoolExhausted, match="all 2 cache slots are in use"):
        pool.allocate(4)
    assert issubclass(PoolExhausted, CapacityError)
    pool.release(first)
    assert (pool.used_slots, pool.free_slots) == (1, 1)
    with pytest.raises(SlotStateError, match="not allocated"):
        pool.release(first)
    with pytest.raises(SlotStateError, match="not allocated"):
        pool.reset(first)
    with pytest.raises(SlotStateError, match="not allocated"):
        pool.gather(torch.tensor([first, second]))
    with pytest.raises(SlotStateError, match=r"slots 0\.\.1"):
        pool.release(7)
    for window in (0, WINDOW + 1):
        with pytest.raises(ValueError, match=rf"1\.\.{WINDOW}"):
            pool.allocate(window)
    new_kv, new_cnn = random_chunk(2, 2, torch.Generator().manual_seed(4))
    third = pool.allocate(1)
    with pytest.raises(ValueError, match="does not fit a slot window of 1"):
        pool.write(torch.tensor([second, third]), new_kv, torch.zeros(2, 2, dtype=torch.int64), new_cnn)
    with pytest.raises(ValueError, match="names a slot twice"):
        pool.write(torch.tensor([second, second]), new_kv, torch.zeros(2, 2, dtype=torch.int64), new_cnn)
    with pytest.raises(ValueError, match="positions must be int64"):
        pool.write(torch.tensor([second]), new_kv[:, :1], torch.zeros(1, 3, dtype=torch.int64), new_cnn[:, :1])
    with pytest.raises(ValueError, match="new_kv must have shape"):
        pool.write(torch.tensor([second]), new_kv, torch.zeros(1, 2, dtype=torch.int64), new_cnn[:, :1])


def test_memory_accounting_matches_the_formula_and_the_tensors() -> None:
    geometry = CacheGeometry(num_layers=12, heads=4, d_k=64, window=48, d_model=256, cnn_frames=14, dtype=torch.float16)
    pool = KvPool(3, geometry)
    formula = 2 * 12 * (4 * 48 * 2 * 64 + 256 * 14) + 8 * 48
    assert pool.bytes_per_slot == formula
    assert pool.total_bytes == 3 * formula
    assert pool.total_bytes == sum(t.numel() * t.element_size() for t in (pool.att, pool.pos, pool.cnn))
    slot = pool.allocate(16)
    assert pool.describe() == {
        "slots": 3,
        "used": 1,
        "layers": 12,
        "heads": 4,
        "window": 48,
        "d_k": 64,
        "d_model": 256,
        "cnn_frames": 14,
        "dtype": "float16",
        "device": "cpu",
        "bytes_per_slot": formula,
        "total_bytes": 3 * formula,
    }
    pool.release(slot)
    assert plan_pool(10 * formula + formula - 1, geometry) == 10
    with pytest.raises(ValueError, match="does not hold one stream"):
        plan_pool(formula - 1, geometry)
    with pytest.raises(ValueError, match="floating point"):
        CacheGeometry(1, 1, 1, 1, 1, 0, torch.int32)


def test_ten_thousand_chunks_never_reallocate() -> None:
    pool = make_pool(num_slots=1, window=8)
    slot = pool.allocate(8)
    tensors = (pool.att, pool.pos, pool.cnn)
    before = [(t.data_ptr(), t.shape, t.untyped_storage().nbytes()) for t in tensors]
    new_kv, new_cnn = random_chunk(1, 4, torch.Generator().manual_seed(5))
    index = torch.tensor([slot])
    for chunk in range(10_000):
        pool.write(index, new_kv, (4 * chunk + torch.arange(4)).unsqueeze(0), new_cnn)
    assert [(t.data_ptr(), t.shape, t.untyped_storage().nbytes()) for t in tensors] == before
    assert (pool.att, pool.pos, pool.cnn) == tensors
    assert sorted(valid_frames(pool, slot)) == list(range(39_992, 40_000))
    assert pool.frames_written(slot) == 40_000


def test_concurrent_allocate_and_release_never_share_a_slot() -> None:
    pool = make_pool(num_slots=8)
    holders: dict[int, int] = {}
    errors: list[str] = []
    guard = threading.Lock()

    def churn(worker: int) -> None:
        for _ in range(300):
            try:
                slot = pool.allocate(4)
            except PoolExhausted:
                continue
            with guard:
                if slot in holders:
                    errors.append(f"slot {slot} held by {holders[slot]} and {worker}")
                holders[slot] = worker
            with guard:
                del holders[slot]
            pool.release(slot)

    threads = [threading.Thread(target=churn, args=(w,)) for w in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert pool.used_slots == 0
    assert pool.free_slots == 8


def test_gather_into_the_reused_buffer_equals_a_fresh_gather() -> None:
    generator = torch.Generator().manual_seed(6)
    pool = make_pool(num_slots=4)
    slots = [pool.allocate(w) for w in (3, 12, 7, 5)]
    new_kv, new_cnn = random_chunk(4, 3, generator)
    pool.write(torch.tensor(slots), new_kv, torch.arange(3).expand(4, 3).contiguous(), new_cnn)
    largest = pool.gather(torch.tensor(slots), reuse_buffer=True)
    pointer = largest.att.data_ptr()
    for batch in ([slots[2]], slots[::-1], slots[1:3]):
        index = torch.tensor(batch)
        fresh, reused = pool.gather(index), pool.gather(index, reuse_buffer=True)
        assert reused.att.is_contiguous() and reused.cnn.is_contiguous()
        assert reused.att.data_ptr() == pointer
        for name in ("att", "pos", "mask", "cnn"):
            assert torch.equal(getattr(fresh, name), getattr(reused, name)), name
        # What a step that reads the pool where it lies gets instead: the same rows, unmoved.
        rows, pos, mask = pool.positions(index)
        assert torch.equal(rows, index) and torch.equal(pos, fresh.pos) and torch.equal(mask, fresh.mask)
        assert torch.equal(pool.att.index_select(1, rows), fresh.att)
        assert torch.equal(pool.cnn.index_select(1, rows), fresh.cnn)
    with pytest.raises(SlotStateError):
        pool.positions(torch.tensor([slots[0], 9]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pool_on_cuda_matches_the_cpu_pool() -> None:
    generator = torch.Generator().manual_seed(8)
    pools = {
        device: KvPool(3, CacheGeometry(LAYERS, HEADS, D_K, WINDOW, D_MODEL, CNN), device=device)
        for device in ("cpu", "cuda")
    }
    slots = {device: [pool.allocate(5), pool.allocate(WINDOW)] for device, pool in pools.items()}
    assert slots["cpu"] == slots["cuda"]
    index = torch.tensor(slots["cpu"])
    for step in range(6):
        new_kv, new_cnn = random_chunk(2, 3, generator)
        positions = (3 * step + torch.arange(3)).expand(2, 3).contiguous()
        for device, pool in pools.items():
            pool.write(index, new_kv.to(device), positions.to(device), new_cnn.to(device), torch.tensor([3, 2]))
    cpu, cuda = (pools[d].gather(index, reuse_buffer=True) for d in ("cpu", "cuda"))
    for name in ("att", "pos", "mask", "cnn"):
        assert torch.equal(getattr(cpu, name), getattr(cuda, name).cpu()), name


def test_a_gather_over_fewer_ring_positions_than_the_pools() -> None:
    """``window``: the first W' ring positions, as many as the batch's slots use; the rest of the
    pool's window, never written for them, is left out; a W' below a slot's window is refused."""
    generator = torch.Generator().manual_seed(8)
    pool = make_pool(num_slots=3)
    slots = [pool.allocate(w) for w in (3, 5, 12)]
    for offset in range(0, 12, 3):
        new_kv, new_cnn = random_chunk(3, 3, generator)
        positions = (offset + torch.arange(3)).expand(3, 3).contiguous()
        pool.write(torch.tensor(slots), new_kv, positions, new_cnn)
    small = torch.tensor(slots[:2])
    full = pool.gather(small)
    for reuse in (False, True):
        part = pool.gather(small, reuse_buffer=reuse, window=5)
        assert part.att.shape[3] == 5 and part.pos.shape == (2, 5)
        assert torch.equal(part.att, full.att[:, :, :, :5]) and torch.equal(part.pos, full.pos[:, :5])
        assert torch.equal(part.mask, full.mask[:, :5]) and torch.equal(part.cnn, full.cnn)
        assert not bool(full.mask[:, 5:].any())  # what was left out held nothing
    rows, _, _ = pool.positions(small, 5)
    assert torch.equal(pool.attention_cache(5).index_select(1, rows), full.att[:, :, :, :5])
    with pytest.raises(ValueError, match="window must be 12"):
        pool.positions(torch.tensor(slots), 5)
    with pytest.raises(ValueError, match="window must be"):
        pool.gather(small, window=pool.window + 1)
