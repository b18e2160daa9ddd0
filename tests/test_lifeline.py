"""Workers of a trial die with it (issue 14): the parts that need no SIGKILLed CLI; that one is
tests/test_cli.py::test_workers_die_with_a_sigkilled_cli."""

from __future__ import annotations

import pickle
import threading

import pytest
import torch
from torch.utils.data import DataLoader

from loadertune.trials.lifeline import DieWithTrial, wrap_worker_init

from workloads import TensorDataset

pytestmark = pytest.mark.slow


def _seen(worker_id: int) -> None:
    torch.manual_seed(1000 + worker_id)


def test_the_users_worker_init_fn_is_kept_and_pickles() -> None:
    wrapped = wrap_worker_init({"worker_init_fn": _seen, "num_workers": 2})
    fn = wrapped["worker_init_fn"]
    assert isinstance(fn, DieWithTrial) and fn.user_fn is _seen
    assert wrap_worker_init(wrapped) == wrapped  # once
    again = pickle.loads(pickle.dumps(fn))
    assert again.user_fn is _seen and again.trial_pid == fn.trial_pid
    assert wrap_worker_init({})["worker_init_fn"].user_fn is None


def test_persistent_workers_started_by_a_short_lived_thread_live_on() -> None:
    """PR_SET_PDEATHSIG fires when the *thread* that started a worker ends: a loader iterated
    by a new thread each epoch (a background prefetcher) must keep its persistent workers."""
    loader = DataLoader(
        TensorDataset(n=64),
        batch_size=8,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=DieWithTrial(_seen),
        timeout=30,
    )
    counts: list[int] = []
    errors: list[BaseException] = []

    def epoch() -> None:
        try:
            counts.append(sum(len(batch) for batch in loader))
        except BaseException as exc:
            errors.append(exc)

    for _ in range(3):
        t = threading.Thread(target=epoch)
        t.start()
        t.join()
    assert not errors, errors
    assert counts == [64, 64, 64]
