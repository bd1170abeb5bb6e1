"""The controller app handles one event at a time (controller/app.py, ``_one_at_a_time``): a handle blocked
sending to a switch is not overtaken by another greenthread's (the tick loop's read-back slipped between
a step's messages), while a handle may call handle again (the wiring and rollout managers do). Threads
stand in for greenthreads here: the launcher patches threading for eventlet, so the same lock is per
greenthread there."""
from __future__ import annotations

import threading
import time


def test_a_second_handle_waits_until_the_first_has_finished(app):
    gate, order = app._one_at_a_time, []
    inside = threading.Event()

    def first():
        with gate:
            order.append("first in")
            inside.set()
            time.sleep(0.2)          # blocked in send_msg, as it were
            order.append("first out")

    def second():
        inside.wait()
        with gate:
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert order == ["first in", "first out", "second in"]


def test_a_handle_may_call_handle_again(app):
    gate, order = app._one_at_a_time, []
    done = threading.Event()

    def nested():
        with gate:
            with gate:
                order.append("nested")
            order.append("outer")
        done.set()

    t = threading.Thread(target=nested)
    t.start()
    assert done.wait(timeout=10)
    with gate:                       # released once the outer one ended
        order.append("after")
    assert order == ["nested", "outer", "after"]
