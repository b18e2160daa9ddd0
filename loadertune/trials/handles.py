"""Open files and connections a dataset made in the main process, which forked workers share.

A worker started by ``fork`` inherits the dataset as it is, open file descriptors included: every
worker then reads through the same open file (one offset: a ``seek`` then a ``read`` in one
worker interleaves with another's) or talks over the same connection (an ``sqlite3`` connection,
a socket). The reads return wrong records, often without any error. With ``num_workers=0`` the
same dataset is right, so a tuner that adds workers makes a correct training wrong (a dataset
that opens an ``sqlite3`` connection or a binary file in ``__init__`` feeds corrupt records into
every epoch). Workers started by
``spawn`` or ``forkserver`` receive the dataset pickled, which such handles refuse (a
``pickle_error``, which the search handles), so only ``fork`` is checked.

The check reads the dataset's attributes, and those of the objects they hold, down to a wrapped
dataset's (``Subset``, ``ConcatDataset``), never calling into them.
"""

from __future__ import annotations

import io
import itertools
import multiprocessing
import socket
import sqlite3
import tarfile
import zipfile
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from loadertune.trials import lifeline

# Types whose objects hold an open file or connection, by module: those of libraries that may
# not be installed (their objects are recognised without importing them).
_HANDLE_MODULES = {
    "h5py": "an HDF5 file (h5py)",
    "lmdb": "an LMDB environment",
    "psycopg": "a PostgreSQL connection",
    "psycopg2": "a PostgreSQL connection",
    "pymysql": "a MySQL connection",
    "pymongo": "a MongoDB client",
}
_DEPTH = 3  # the dataset's attributes, theirs (a Subset's dataset), and theirs
_MAX_ITEMS = 64  # of a list, tuple or dict attribute


def _what(value: Any) -> str | None:
    """What kind of shared handle ``value`` is, or None."""
    if isinstance(value, io.IOBase):
        return None if value.closed else "an open file"
    if isinstance(value, sqlite3.Connection):
        return "an sqlite3 connection"
    if isinstance(value, socket.socket):
        return None if value.fileno() < 0 else "a socket"
    if isinstance(value, zipfile.ZipFile):
        return None if value.fp is None else "an open zip file"
    if isinstance(value, tarfile.TarFile):
        return None if getattr(value, "closed", False) else "an open tar file"
    module = type(value).__module__.split(".")[0]
    return _HANDLE_MODULES.get(module)


def _attributes(value: Any) -> list[tuple[str, Any]]:
    """The first :data:`_MAX_ITEMS` of what ``value`` holds, named (a dataset's index of a
    million entries is not copied to look at its first few)."""
    if isinstance(value, list | tuple):
        return [(f"[{i}]", v) for i, v in enumerate(value[:_MAX_ITEMS])]
    named: Iterator[tuple[str, Any]]
    if isinstance(value, dict):
        named = ((f"[{k!r}]", v) for k, v in value.items())
    else:
        try:
            attrs = vars(value)
        except TypeError:  # no __dict__
            return []
        named = ((f".{k}", v) for k, v in attrs.items())
    return list(itertools.islice(named, _MAX_ITEMS))


def shared_handles(dataset: Any) -> list[str]:
    """The open files and connections ``dataset`` holds (``"Rows.f (an open file)"``)."""
    found: list[str] = []
    seen: set[int] = set()

    def visit(value: Any, path: str, depth: int) -> None:
        if id(value) in seen or len(found) >= 4:
            return
        seen.add(id(value))
        what = _what(value)
        if what is not None:
            found.append(f"{path} ({what})")
            return
        if depth < _DEPTH and not isinstance(value, str | bytes | int | float):
            for name, inner in _attributes(value):
                visit(inner, path + name, depth + 1)

    visit(dataset, type(dataset).__name__, 0)
    return found


def _forks(context: Any) -> bool:
    """Whether workers of a DataLoader given ``multiprocessing_context=context`` are forked."""
    if isinstance(context, str):
        return context == "fork"
    if context is not None:  # (DataLoader converts a name to a context object)
        return getattr(context, "_name", None) == "fork"
    method = multiprocessing.get_start_method(allow_none=True)  # (not fixing it, if unset)
    return (method or multiprocessing.get_all_start_methods()[0]) == "fork"


def forked_handles(dataset: Any, multiprocessing_context: Any = None) -> list[str]:
    """:func:`shared_handles` of ``dataset`` where a DataLoader given ``multiprocessing_context``
    forks its workers (none where it pickles the dataset for them)."""
    return shared_handles(dataset) if _forks(multiprocessing_context) else []


def fork_warning(
    dataset: Any, multiprocessing_context: Any = None, worker_init_fn: Any = None
) -> str | None:
    """What to say of ``dataset`` when the forked workers of a DataLoader built with these
    arguments would share its handles; None when they would not."""
    handles = forked_handles(dataset, multiprocessing_context)
    if not handles:
        return None
    them = "them" if len(handles) > 1 else "it"
    opened_again = ""
    if lifeline.users_worker_init(worker_init_fn) is not None:
        opened_again = f" (unless your worker_init_fn opens {them} again)"
    return (
        f"the dataset holds {', '.join(handles)}, made in the main process: forked workers "
        f"share {them}{opened_again}, and their reads can return wrong records without an "
        f"error (one file offset, one connection for all); open {them} in each worker (on "
        "first use in __getitem__, or in worker_init_fn) before using workers; num_workers=0 "
        "is safe"
    )


def loader_fork_warning(loader: DataLoader[Any]) -> str | None:
    """:func:`fork_warning` for ``loader``'s dataset and arguments."""
    return fork_warning(loader.dataset, loader.multiprocessing_context, loader.worker_init_fn)
