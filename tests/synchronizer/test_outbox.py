import threading

from ddiloco.synchronizer.outbox import Outbox


def test_control_overtakes_an_update_between_chunks():
    box = Outbox()
    box.put_update(0, 1, [b"u1", b"u2", b"u3"])
    assert box.get(0.1) == b"u1"
    box.put_control(b"req")
    assert [box.get(0.1) for _ in range(3)] == [b"req", b"u2", b"u3"]
    assert box.get(0.01) is None


def test_newer_update_replaces_a_queued_older_one_but_not_the_reverse():
    box = Outbox()
    box.put_update(3, 1, [b"v1"])
    box.put_update(3, 2, [b"v2"])
    box.put_update(3, 1, [b"v1-again"])
    box.put_update(4, 1, [b"other"])
    assert [box.get(0.1), box.get(0.1), box.get(0.01)] == [b"v2", b"other", None]


def test_a_forced_resend_replaces_the_same_version_and_yields_to_a_newer_one():
    box = Outbox()
    box.put_update(0, 5, [b"v5"])
    box.put_update(0, 5.5, [b"v5-forced"])
    assert box.get(0.1) == b"v5-forced"
    box.put_update(0, 5.5, [b"forced"])
    box.put_update(0, 6, [b"v6"])
    assert box.get(0.1) == b"v6"


def test_close_wakes_a_waiting_reader():
    box = Outbox()
    out = []
    t = threading.Thread(target=lambda: out.append(box.get(5.0)))
    t.start()
    box.close()
    t.join(2)
    assert out == [None] and not t.is_alive()
    box.put_control(b"x")
    assert box.get(0.01) is None


def test_a_version_already_streamed_is_not_sent_again_unless_forced():
    box = Outbox()
    box.put_update(2, 7, [b"v7"])
    assert box.get(0.1) == b"v7"
    box.put_update(2, 7, [b"v7-reply"])  # a reply to stale work after the broadcast: the learner holds 7
    box.put_update(2, 6, [b"v6"])
    assert box.get(0.01) is None
    box.put_update(2, 7.5, [b"v7-forced"])  # a repair: always sent
    assert box.get(0.1) == b"v7-forced"
