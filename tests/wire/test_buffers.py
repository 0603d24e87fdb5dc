import gc

import torch

from ddiloco.wire import framing, reassembly
from ddiloco.wire.buffers import BufferPool

MB = 1 << 20


def _address(view: memoryview) -> int:
    return torch.frombuffer(view, dtype=torch.uint8).data_ptr()


def test_a_buffer_comes_back_only_when_its_last_view_is_gone():
    pool = BufferPool(8 * MB)
    first = pool.take(2 * MB)
    where = _address(first)
    tensor = torch.frombuffer(first[64:1024], dtype=torch.float32)  # a view of a slice, as decoding makes
    del first
    gc.collect()
    assert pool.free_bytes == 0  # the tensor still reads it
    second = pool.take(2 * MB)
    assert _address(second) != where and pool.allocated == 2
    del tensor
    assert pool.free_bytes == 2 * MB
    third = pool.take(2 * MB)
    assert _address(third) == where and pool.reused == 1 and pool.free_bytes == 0


def test_what_the_pool_keeps_is_capped_oldest_first_and_small_buffers_are_not_pooled():
    pool = BufferPool(5 * MB)
    loans = [pool.take(2 * MB), pool.take(2 * MB), pool.take(3 * MB)]
    addresses = [_address(v) for v in loans]
    while loans:  # back in the order 2, 2, 3 MB: keeping all would be 7 MB
        del loans[0]
    assert pool.free_bytes == 5 * MB
    three, two = pool.take(3 * MB), pool.take(2 * MB)
    assert _address(three) == addresses[2] and _address(two) == addresses[1]  # the oldest 2 MB went
    assert pool.free_bytes == 0
    small = pool.take(MB // 2)
    del small
    huge = pool.take(6 * MB)  # over the cap: never kept
    del huge
    assert pool.free_bytes == 0


def test_a_reassembled_message_is_never_overwritten_while_its_tensors_live():
    pool = BufferPool(64 * MB)
    r = reassembly.Reassembler(1 << 30, pool=pool)
    a, b = torch.randn(MB), torch.randn(MB)  # 4 MB each in fp32: pooled
    [first] = [m for f in framing.tensor_frames({"k": 1}, {"w": a}, "fp32", MB // 2) if (m := r.feed(f))]
    kept = first.tensors({"w": (MB,)})["w"]  # a view of the message's buffer
    del first
    [second] = [m for f in framing.tensor_frames({"k": 2}, {"w": b}, "fp32", MB // 2) if (m := r.feed(f))]
    assert torch.equal(kept, a) and torch.equal(second.tensors()["w"], b)
    assert pool.reused == 0
    del kept, second
    [third] = [m for f in framing.tensor_frames({"k": 3}, {"w": a}, "fp32", MB // 2) if (m := r.feed(f))]
    assert pool.reused == 1 and torch.equal(third.tensors()["w"], a)


def test_a_declared_size_the_system_cannot_reserve_is_a_wire_error():
    frame = framing.pack_frame({"msg": 1, "part": 0, "parts": 2, "head": {"nbytes": 1 << 62}}, b"x")
    for pool in (None, BufferPool(MB)):
        try:
            reassembly.Reassembler(1 << 63, pool=pool).feed(frame)
        except framing.WireError as exc:
            assert "cannot reserve" in str(exc)
        else:
            raise AssertionError("a 4 EiB message was accepted")
