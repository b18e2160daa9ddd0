"""The private torch and multiprocessing names loadertune relies on are all there.

When this fails after a torch upgrade, the message names what is gone; the header of
``loadertune/trials/torch_internals.py`` says what each name is for and what breaks without it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL

from loadertune.trials import torch_internals as internals


def test_every_private_name_used_is_in_the_installed_torch() -> None:
    assert internals.missing() == [], (
        f"torch {torch.__version__} lacks {internals.missing()}: see the header of "
        "loadertune/trials/torch_internals.py for what each is used for"
    )


def test_the_instance_attributes_are_on_a_live_multi_worker_iterator() -> None:
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1)
    iterator = iter(loader)
    try:
        next(iterator)
        assert internals.missing(iterator) == []
    finally:
        assert internals.shut_down(iterator)


def test_a_missing_name_is_reported_by_name() -> None:
    class Bare:  # an "iterator" from a torch that renamed everything
        pass

    assert internals.missing(Bare()) == [f"Bare.{name}" for name in internals.INSTANCE_ATTRIBUTES]


def test_missing_live_checks_a_real_iterator_and_leaves_no_worker() -> None:
    assert internals.missing_live() == []


def test_the_pin_thread_is_stopped_before_the_workers_without_waiting_its_poll() -> None:
    """Pinning needs a GPU (tests/test_gpu.py has the real thread); here a thread that waits
    on the worker result queue as torch's pin-memory loop does (5 s per wait) stands in."""
    loader = DataLoader(list(range(64)), batch_size=2, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    done, raised = threading.Event(), []

    def pin_loop() -> None:
        try:
            while not done.is_set():
                with contextlib.suppress(queue.Empty):
                    iterator._worker_result_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
        except Exception as exc:  # what torch's thread would print
            raised.append(exc)

    thread = threading.Thread(target=pin_loop, daemon=True)
    thread.start()
    iterator._pin_memory_thread, iterator._pin_memory_thread_done_event = thread, done
    time.sleep(0.3)  # the workers' prefetched batches are read; it waits on an empty queue
    t0 = time.monotonic()
    internals.stop_pin_thread(iterator)
    assert not thread.is_alive() and time.monotonic() - t0 < 1.0 and not raised
    assert internals.shut_down(iterator)
