from __future__ import annotations

import threading
import time

from stages.base import key_lock


def test_key_lock_serialises_the_same_key(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    order: list[str] = []
    inside = threading.Event()

    def first():
        with key_lock("sft", "k1"):
            order.append("first in")
            inside.set()
            time.sleep(0.3)
            order.append("first out")

    def second():
        inside.wait()
        with key_lock("sft", "k1"):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order == ["first in", "first out", "second in"]


def test_key_lock_does_not_block_other_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    with key_lock("sft", "k1"):
        done = threading.Event()
        t = threading.Thread(target=lambda: (key_lock("sft", "k2").__enter__(), done.set()))
        t.start()
        assert done.wait(5)
