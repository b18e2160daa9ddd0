"""Ctrl-C held over a block (a write to the study, a worker's fork): it waits for the block's
end, then acts as it would have; a process forked in the block is not held."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from torch.utils.data import DataLoader

from loadertune import signals
from loadertune.trials import loader as dl

_fork_ctrl_c = False  # the at-fork callback below sends Ctrl-C only while a test asks it to


def _ctrl_c_in_fork() -> None:
    global _fork_ctrl_c
    if _fork_ctrl_c and threading.current_thread() is threading.main_thread():
        _fork_ctrl_c = False
        os.kill(os.getpid(), signal.SIGINT)


os.register_at_fork(after_in_parent=_ctrl_c_in_fork)


def test_ctrl_c_waits_for_the_blocks_end() -> None:
    steps: list[str] = []
    with pytest.raises(KeyboardInterrupt), signals.held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler would have run by now
        steps.append("rest of the block")
    assert steps == ["rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_in_a_workers_fork_is_not_lost() -> None:
    """Python drops an exception raised in an at-fork callback ("Exception ignored"): a Ctrl-C
    that lands there while a loader's workers start was lost."""
    global _fork_ctrl_c
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1)
    _fork_ctrl_c = True
    try:
        with pytest.raises(KeyboardInterrupt):
            dl.started(loader)
    finally:
        _fork_ctrl_c = False


def _sleep() -> None:
    time.sleep(60)


def test_a_process_forked_in_the_block_is_not_held() -> None:
    """A worker forked while the handler holds Ctrl-C inherits that handler: it acts there as
    the one it replaced (Ctrl-C ends the worker), not as a hold no block will ever end."""
    ctx = multiprocessing.get_context("fork")
    with signals.held():
        child = ctx.Process(target=_sleep)
        child.start()
    try:
        time.sleep(0.3)
        os.kill(child.pid, signal.SIGINT)  # type: ignore[arg-type]
        child.join(20)
        assert child.exitcode is not None and child.exitcode != 0
    finally:
        child.kill()
        child.join()


def test_outside_the_main_thread_the_block_runs_as_it_is() -> None:
    ran: list[object] = []

    def block() -> None:
        with signals.held():
            ran.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=block)
    t.start()
    t.join()
    assert ran == [signal.default_int_handler]


class _CtrlCWhenFreed:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_in_a_trials_teardown_finalizers_interrupts_the_search(monkeypatch) -> None:
    """Python drops an exception raised in a finalizer, and a trial's teardown runs many
    (torch's shutdown, the queues' feeder joins, the collection): a Ctrl-C that landed in one
    was lost, and ``tune_loader`` ran its whole budget (2 of 64 Ctrl-C's of a stress test)."""
    from loadertune import tune_loader
    from loadertune.errors import SearchInterrupted
    from loadertune.trials import inline

    collect = inline.gc.collect
    sent: list[bool] = []

    def collect_and_drop() -> int:
        if not sent:
            sent.append(True)
            _CtrlCWhenFreed()  # freed at once: its __del__ sends Ctrl-C
        return collect()

    monkeypatch.setattr(inline.gc, "collect", collect_and_drop)
    with pytest.raises(SearchInterrupted):
        tune_loader(list(range(512)), batch_size=16, budget_s=20, verbose=False, resume=False)
    assert sent
