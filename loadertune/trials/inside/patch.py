"""Patch ``torch.utils.data.DataLoader`` so an unmodified script's loader can be tuned or set.

The class's own ``__init__`` and ``__iter__`` are replaced in place, not the name in a module, so
every way a script reaches the class sees the patch: ``from torch.utils.data import DataLoader``,
``import torch.utils.data as tud``, an alias, a subclass, or a reference taken before the patch.

Each loader is numbered in order of creation (1, 2, ...) and remembers where it was created,
which of the loaders created together there it is, and what it was rebuilt from
(:mod:`loadertune.trials.inside.identity`: ``train.py:42``, the user's own line, also when a
framework created or rebuilt the loader).
A :class:`Controller` decides, per loader, which keyword arguments it is built with and what
iterating it returns. Only the arguments the script passed are forwarded; the rest keep
DataLoader's defaults, so everything else (dataset, sampler, collate_fn, generator...) is kept.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from torch.utils.data import DataLoader

from loadertune import signals
from loadertune.trials.inside.identity import (
    RECORD_ATTRIBUTE,
    LoaderRecord,
    Siblings,
    describe_creation,
    matches_site,
)
from loadertune.trials.loader import quiet_worker_warning

__all__ = [
    "Controller",
    "LoaderRecord",
    "OriginalIter",
    "length_asked",
    "matches_site",
    "patched",
    "promised_batches",
]

# DataLoader's own __iter__, which a controller calls to iterate a loader for real
OriginalIter = Callable[[DataLoader[Any]], Iterator[Any]]


class Controller(Protocol):
    def on_create(self, record: LoaderRecord, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments to build loader ``record`` with (``arguments``: the script's)."""

    def on_iter(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        """What ``iter(loader)`` returns; ``original(loader)`` is DataLoader's own iterator."""


_SIGNATURE = inspect.signature(DataLoader.__init__)
# set on a patched loader once anything asks its length (a schedule sized by it, a progress bar)
LENGTH_ASKED = "_loadertune_length_asked"


def length_asked(loader: DataLoader[Any]) -> bool:
    """Whether anything asked ``len(loader)`` (or ``len()`` of one of its epochs) while patched:
    then the script may count on an epoch having that many batches (a ``OneCycleLR`` sized by
    ``epochs * len(loader)`` raises at the step past its last)."""
    return bool(loader.__dict__.get(LENGTH_ASKED))


def mark_length_asked(loader: DataLoader[Any]) -> None:
    """Note that the script asked ``loader``'s length where no patch sees it (a loader tuned in
    code: :func:`loadertune.tuned`)."""
    loader.__dict__[LENGTH_ASKED] = True


def promised_batches(loader: DataLoader[Any]) -> int | None:
    """The batches per epoch the script was told (``len(loader)``, as DataLoader's own
    ``__len__`` counts a map-style loader's) once anything asked; None when nothing did or its
    batch sampler has no length."""
    if not length_asked(loader):
        return None
    try:
        return len(loader.batch_sampler)  # type: ignore[arg-type]
    except TypeError:
        return None


@contextlib.contextmanager
def patched(controller: Controller) -> Iterator[None]:
    """Route every DataLoader's construction and iteration through ``controller``, and note
    which loaders were asked their length (:func:`length_asked`); undo after."""
    orig_init, orig_iter, orig_len = DataLoader.__init__, DataLoader.__iter__, DataLoader.__len__
    numbers = itertools.count(1)
    siblings = Siblings()  # loaders created together at one line are distinct loaders

    @functools.wraps(orig_init)
    def __init__(self: DataLoader[Any], *args: Any, **kwargs: Any) -> None:
        arguments = _SIGNATURE.bind(self, *args, **kwargs).arguments
        arguments.pop("self")
        arguments.update(arguments.pop("kwargs", {}))  # DataLoader has no **kwargs today; be safe
        record = siblings.named(
            describe_creation(
                self, sys._getframe(1), index=next(numbers), dataset=arguments.get("dataset")
            )
        )
        # torch checks the worker count when a loader is built and again when it is iterated:
        # the controller decides at iteration whether its warning is said (``on_iter``).
        with quiet_worker_warning():
            orig_init(self, **controller.on_create(record, arguments))
        object.__setattr__(self, RECORD_ATTRIBUTE, record)

    def original(loader: DataLoader[Any]) -> Iterator[Any]:
        with signals.held():  # the workers' fork: a Ctrl-C there would be lost
            return orig_iter(loader)

    @functools.wraps(orig_iter)
    def __iter__(self: DataLoader[Any]) -> Iterator[Any]:
        record = self.__dict__.get(RECORD_ATTRIBUTE)
        if record is None:  # built before the patch
            return original(self)
        siblings.iterated(record)
        return controller.on_iter(self, record, original)

    @functools.wraps(orig_len)
    def __len__(self: DataLoader[Any]) -> int:
        if RECORD_ATTRIBUTE in self.__dict__:
            self.__dict__[LENGTH_ASKED] = True
        return orig_len(self)

    DataLoader.__init__ = __init__  # type: ignore[method-assign]
    DataLoader.__iter__ = __iter__  # type: ignore[method-assign,assignment]
    DataLoader.__len__ = __len__  # type: ignore[method-assign]
    try:
        yield
    finally:
        DataLoader.__init__ = orig_init  # type: ignore[method-assign]
        DataLoader.__iter__ = orig_iter  # type: ignore[method-assign]
        DataLoader.__len__ = orig_len  # type: ignore[method-assign]
