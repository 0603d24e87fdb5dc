"""`one_thread`: a push's receiving thread runs its torch ops (the streamed norms) on itself alone,
and every other thread keeps its own OpenMP thread count, during and after."""

import threading

import pytest
import torch
from threadpoolctl import ThreadpoolController

from ddiloco.synchronizer.one_thread import one_thread

pytestmark = pytest.mark.skipif(
    not ThreadpoolController().select(user_api="openmp").lib_controllers, reason="torch without OpenMP"
)


def test_only_the_calling_thread_is_limited_and_only_while_inside():
    before = torch.get_num_threads()
    if before < 2:
        torch.set_num_threads(2)
    try:
        seen: dict[str, int] = {}
        inside, release = threading.Event(), threading.Event()

        def receiver() -> None:
            seen["outside"] = torch.get_num_threads()
            with one_thread():
                seen["inside"] = torch.get_num_threads()
                torch.linalg.vector_norm(torch.ones(1 << 20))  # a torch op in the limited thread
                inside.set()
                release.wait(30)
            seen["after"] = torch.get_num_threads()

        t = threading.Thread(target=receiver)
        t.start()
        assert inside.wait(30)
        others = {"main": torch.get_num_threads()}
        fresh = threading.Thread(target=lambda: others.update(fresh=torch.get_num_threads()))
        fresh.start()
        fresh.join(30)
        release.set()
        t.join(30)
        n = torch.get_num_threads()
        assert n >= 2
        assert seen == {"outside": n, "inside": 1, "after": n}
        assert others == {"main": n, "fresh": n}
    finally:
        torch.set_num_threads(before)
