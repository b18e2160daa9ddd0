"""The private torch and multiprocessing names loadertune relies on are all there.

When this fails after a torch upgrade, the message names what is gone; the header of
``loadertune/trials/_torch_internals.py`` says what each name is for and what breaks without it.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from loadertune.trials import _torch_internals as internals


def test_every_private_name_used_is_in_the_installed_torch() -> None:
    assert internals.missing() == [], (
        f"torch {torch.__version__} lacks {internals.missing()}: see the header of "
        "loadertune/trials/_torch_internals.py for what each is used for"
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
