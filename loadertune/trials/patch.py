"""Patch ``torch.utils.data.DataLoader`` so an unmodified script's loader can be tuned or set.

The class's own ``__init__`` and ``__iter__`` are replaced in place, not the name in a module, so
every way a script reaches the class sees the patch: ``from torch.utils.data import DataLoader``,
``import torch.utils.data as tud``, an alias, a subclass, or a reference taken before the patch.

Each loader is numbered in order of creation (1, 2, ...) and remembers where it was created
(``train.py:42``, the first frame outside torch, loadertune and the loader's own ``__init__``).
A :class:`Controller` decides, per loader, which keyword arguments it is built with and what
iterating it returns. Only the arguments the script passed are forwarded; the rest keep
DataLoader's defaults, so everything else (dataset, sampler, collate_fn, generator...) is kept.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from torch.utils.data import DataLoader

from loadertune.config import Config
from loadertune.trials import loader as dl

_RECORD = "_loadertune_record"
_SKIP_DIRS = tuple(
    os.path.dirname(m.__file__ or "") + os.sep
    for m in (sys.modules["torch"], sys.modules["loadertune"])
)


# DataLoader's own __iter__, which a controller calls to iterate a loader for real
OriginalIter = Callable[[DataLoader[Any]], Iterator[Any]]


@dataclass(frozen=True)
class LoaderRecord:
    """Which loader this is: its order of creation (from 1) and its call site (``file:line``)."""

    index: int
    call_site: str


def call_site(loader: object) -> str:
    """``file:line`` of the code that created ``loader``, skipping torch, loadertune and the
    ``__init__`` of DataLoader subclasses (so a subclass's creation site is reported)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIP_DIRS) and frame.f_locals.get("self") is not loader:
            return f"{os.path.relpath(path) if os.path.isabs(path) else path}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>:0"


def matches_site(site: str, wanted: str) -> bool:
    """``wanted`` (``FILE:LINE``) names ``site``: same line; the same file, or a suffix of it."""
    path, _, line = site.rpartition(":")
    want_path, _, want_line = wanted.rpartition(":")
    if line != want_line:
        return False
    norm = os.path.normpath
    return (
        norm(path) == norm(want_path)
        or norm(path).endswith(os.sep + norm(want_path).lstrip(os.sep))
        or os.path.basename(path) == want_path
    )


class Controller(Protocol):
    def on_create(self, record: LoaderRecord, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments to build loader ``record`` with (``arguments``: the script's)."""

    def on_iter(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        """What ``iter(loader)`` returns; ``original(loader)`` is DataLoader's own iterator."""


_SIGNATURE = inspect.signature(DataLoader.__init__)


@contextlib.contextmanager
def patched(controller: Controller) -> Iterator[None]:
    """Route every DataLoader's construction and iteration through ``controller``; undo after."""
    orig_init, orig_iter = DataLoader.__init__, DataLoader.__iter__
    numbers = itertools.count(1)

    @functools.wraps(orig_init)
    def __init__(self: DataLoader[Any], *args: Any, **kwargs: Any) -> None:
        arguments = _SIGNATURE.bind(self, *args, **kwargs).arguments
        arguments.pop("self")
        arguments.update(arguments.pop("kwargs", {}))  # DataLoader has no **kwargs today; be safe
        record = LoaderRecord(next(numbers), call_site(self))
        orig_init(self, **controller.on_create(record, arguments))
        object.__setattr__(self, _RECORD, record)

    @functools.wraps(orig_iter)
    def __iter__(self: DataLoader[Any]) -> Iterator[Any]:
        record = self.__dict__.get(_RECORD)
        if record is None:  # built before the patch
            return orig_iter(self)
        return controller.on_iter(self, record, orig_iter)

    DataLoader.__init__ = __init__  # type: ignore[method-assign]
    DataLoader.__iter__ = __iter__  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        DataLoader.__init__ = orig_init  # type: ignore[method-assign]
        DataLoader.__iter__ = orig_iter  # type: ignore[method-assign]


class Apply:
    """A controller that builds one loader with saved settings and leaves the others alone.

    Args:
        config: the settings to apply.
        index: the loader's order of creation (1 = the first DataLoader the script creates).
        expected_site: where the recommendation found that loader; a mismatch is reported.
        report: called with one line about what was applied (or why not).
    """

    def __init__(
        self,
        config: Config,
        *,
        index: int,
        expected_site: str | None = None,
        report: Callable[[str], None] = print,
    ) -> None:
        self.config = config
        self.index = index
        self.expected_site = expected_site
        self.report = report
        self.applied: LoaderRecord | None = None

    def on_create(self, record: LoaderRecord, arguments: dict[str, Any]) -> dict[str, Any]:
        if record.index != self.index:
            return arguments
        return self.apply(record, arguments)

    def apply(self, record: LoaderRecord, arguments: dict[str, Any]) -> dict[str, Any]:
        """Build loader ``record`` with these settings, and say so."""
        self.applied = record
        note = ""
        if self.expected_site and not matches_site(record.call_site, self.expected_site):
            note = f" (the recommendation was measured on the loader at {self.expected_site})"
        self.report(
            f"loadertune: DataLoader #{record.index} at {record.call_site}: "
            f"{self.config.label()}{note}"
        )
        return dl.apply_settings(arguments, self.config)

    def on_iter(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        return original(loader)


class ApplyEach:
    """A controller for several loaders of one script, each with its own saved settings: each
    :class:`Apply` is applied to the first loader created at its ``expected_site``."""

    def __init__(self, each: list[Apply]) -> None:
        self.each = each

    def on_create(self, record: LoaderRecord, arguments: dict[str, Any]) -> dict[str, Any]:
        for apply in self.each:
            site = apply.expected_site
            if apply.applied is None and site and matches_site(record.call_site, site):
                return apply.apply(record, arguments)
        return arguments

    def on_iter(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        return original(loader)
