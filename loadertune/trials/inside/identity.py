"""Which DataLoader is which: the user's own line that created it, and what it was rebuilt from.

Frameworks create loaders for the user, or rebuild the user's: the Hugging Face ``Trainer``
creates one inside ``get_train_dataloader``, Accelerate's ``prepare`` builds a new loader (with
a ``batch_sampler``) from the user's, Lightning re-instantiates the user's loader to inject a
sampler. A loader is named by

- its **call site**: the first frame of the creating stack in the user's own files (not the
  standard library, not an installed package, not torch or loadertune), e.g. ``train.py:42``;
- its **key**: what tells it apart from every other loader of the script, stable from one run
  to the next: the user's frames (innermost first), after the framework's functions that created
  it when a framework did (``transformers/trainer.py:get_train_dataloader``: functions rather
  than lines, so that a framework's upgrade keeps the key). A loader created again at every
  epoch (inline in the epoch loop, or by a ``train_dataloader()`` called per epoch) has the same
  key each time: it is one loader;
- its **ordinal**: loaders created at the same frames before any of them is iterated (a list
  comprehension, a loop building one loader per dataset) are distinct loaders: the second and
  later get ``#N at this line`` in their key (:class:`Siblings`). One created after a loader of
  its key was iterated is a re-creation (a loader created at every epoch): the same loader;
- its **origin**: when a framework builds it from a loader created before (a DataLoader held by
  a framework frame between the constructor and the user's code, as Accelerate's
  ``prepare_data_loader(dataloader)`` holds the user's), it is that loader: it takes the
  origin's call site and key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
import os
import re
import site
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

RECORD_ATTRIBUTE = "_loadertune_record"  # set on each DataLoader the patch sees created
_ORDINAL = re.compile(r"#(\d+) at this line")  # a key's element: the N-th of its siblings


def _library_dirs() -> tuple[str, ...]:
    """Folders holding code that is not the user's: the standard library, installed packages,
    torch and loadertune (wherever they are installed from)."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts")}
    with contextlib.suppress(AttributeError):  # a virtualenv's old site.py
        dirs.update(site.getsitepackages())
    user_site = getattr(site, "USER_SITE", None)
    if user_site:
        dirs.add(user_site)
    for name in ("torch", "loadertune"):
        module = sys.modules.get(name)
        if module is not None and module.__file__:
            dirs.add(os.path.dirname(module.__file__))
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


# Where this package lies, from this file: ``loadertune.__file__`` is None where a folder named
# ``loadertune`` in the working directory shadows an editable install as a namespace package.
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")
_LIBRARY_DIRS = (*_library_dirs(), PACKAGE_DIR)
_SKIP_DIRS = (
    os.path.join(os.path.dirname(sys.modules["torch"].__file__ or "<none>"), ""),
    PACKAGE_DIR,
)


def is_user_file(path: str) -> bool:
    """Whether ``path`` is the user's own code rather than a library's (``<frozen ...>`` and
    other generated code is not)."""
    if path.startswith("<"):
        return False
    if not os.path.isabs(path):
        return True  # code compiled under a relative name (exec of a script's text)
    real = os.path.realpath(path)
    return not real.startswith(_LIBRARY_DIRS) and not path.startswith(_LIBRARY_DIRS)


def user_sources() -> list[str]:
    """The files of the user's own Python modules imported so far (:func:`is_user_file`): with
    the script, the code that decides what a trial measures (a dataset class in a module beside
    it, say)."""
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if (
            isinstance(path, str)
            and path.endswith(".py")
            and os.path.isabs(path)
            and is_user_file(path)
        ):
            files.add(os.path.realpath(path))
    return sorted(files)


def _display(path: str) -> str:
    return os.path.relpath(path) if os.path.isabs(path) else path


def _library_name(path: str) -> str:
    """A library file as its package names it (``transformers/trainer.py``)."""
    real = os.path.realpath(path)
    for root in sorted(_LIBRARY_DIRS, key=len, reverse=True):
        if real.startswith(root):
            return os.path.relpath(real, root)
    return os.path.basename(path)


@dataclass(frozen=True)
class LoaderRecord:
    """One DataLoader the script created.

    Attributes:
        index: its order of creation, from 1.
        call_site: ``file:line`` of the user's own code that created it (or its origin).
        key: what identifies it from run to run (see the module docstring); ``(call_site,)``
            when not given.
        origin: the index of the loader it was rebuilt from, or None.
        dataset: ``module.QualifiedName`` of its dataset's class.
        lines: the source text of the key's user frames, innermost first (stripped; "" where
            the file cannot be read): what still names the loader once an edit above it has
            moved its lines (:func:`same_code`).
    """

    index: int
    call_site: str
    key: tuple[str, ...] = field(default=(), compare=False)
    origin: int | None = field(default=None, compare=False)
    dataset: str = field(default="", compare=False)
    lines: tuple[str, ...] = field(default=(), compare=False)

    @property
    def identity(self) -> tuple[str, ...]:
        return self.key or (self.call_site,)

    def describe(self) -> str:
        """``#3 at train.py:42 (mypkg.Images)``, which of the loaders created there together it
        is, and what it was rebuilt from."""
        dataset = f" ({self.dataset})" if self.dataset else ""
        n = ordinal(self.identity)
        which = f", the {nth(n)} created there" if n > 1 else ""
        rebuilt = f", rebuilt from #{self.origin}" if self.origin is not None else ""
        return f"#{self.index} at {self.call_site}{dataset}{which}{rebuilt}"


def ordinal(key: Sequence[str]) -> int:
    """Which of the loaders created together at its frames ``key`` names (1: the first)."""
    for element in key:
        found = _ORDINAL.fullmatch(element)
        if found:
            return int(found.group(1))
    return 1


def nth(n: int) -> str:
    """``1st``, ``2nd``, ``23rd``, ``11th``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class Siblings:
    """Tells apart loaders created at the same frames (see the module docstring): the first
    gets the key as it is, the second and later, created before any of them was iterated, the
    key with ``#N at this line``. Iterating a loader of the key starts the count again."""

    def __init__(self) -> None:
        self._created: dict[tuple[str, ...], int] = {}  # by key less its ordinal

    def named(self, record: LoaderRecord) -> LoaderRecord:
        """``record`` (just created), with its ordinal in its key when it has one."""
        if record.origin is not None:
            return record  # a framework's copy of a loader: that loader, ordinal and all
        base = record.identity
        n = self._created[base] = self._created.get(base, 0) + 1
        if n == 1:
            return record
        return dataclasses.replace(record, key=(*base, f"#{n} at this line"))

    def iterated(self, record: LoaderRecord) -> None:
        """A loader of ``record``'s key is iterated: the next one created there is that loader
        created again."""
        base = tuple(e for e in record.identity if not _ORDINAL.fullmatch(e))
        self._created.pop(base, None)


def record_of(obj: object) -> LoaderRecord | None:
    """The record the patch set on a DataLoader (None for anything else). Reads the instance's
    own ``__dict__``: a wrapper that forwards attributes (Accelerate's ``DataLoaderShard``) is not
    taken for the loader it wraps."""
    try:
        record = vars(obj).get(RECORD_ATTRIBUTE)
    except TypeError:
        return None
    return record if isinstance(record, LoaderRecord) else None


def dataset_name(dataset: object) -> str:
    kind = type(dataset)
    return f"{kind.__module__}.{kind.__qualname__}"


def _holds(frame: FrameType, loader: object) -> bool:
    return any(value is loader for value in list(frame.f_locals.values()))


def _origin_in(frame: FrameType, loader: object) -> LoaderRecord | None:
    """A DataLoader (created before, and recorded) that a framework frame holds."""
    for value in list(frame.f_locals.values()):
        if value is loader:
            continue
        record = record_of(value)
        if record is not None:
            return record
    return None


def describe_creation(
    loader: object, frame: FrameType | None, *, index: int, dataset: object
) -> LoaderRecord:
    """The record of ``loader``, created now; ``frame`` is its constructor's caller."""
    framework: list[str] = []  # library frames between the constructor and the user's code
    first_site: str | None = None
    user: list[str] = []
    lines: list[str] = []
    origin: LoaderRecord | None = None
    while frame is not None:
        path = frame.f_code.co_filename
        if user and path.startswith(PACKAGE_DIR):
            break  # what ran the script (a trial process, `loadertune run`): not the script's
        if path.startswith(_SKIP_DIRS) or _holds(frame, loader):
            frame = frame.f_back  # torch, loadertune, or an __init__ of the loader (a subclass's,
            continue  # a framework's wrapper of __init__): the loader is being built there
        if is_user_file(path):
            user.append(f"{_display(path)}:{frame.f_lineno}")
            linecache.checkcache(path)  # the file as it is now (a test may rewrite it)
            lines.append(linecache.getline(path, frame.f_lineno).strip())
        elif not user:
            framework.append(f"{_library_name(path)}:{frame.f_code.co_name}")
            if origin is None:
                origin = _origin_in(frame, loader)
        if first_site is None:
            first_site = f"{_display(path)}:{frame.f_lineno}"
        frame = frame.f_back
    name = dataset_name(dataset)
    if origin is not None:
        return LoaderRecord(
            index, origin.call_site, origin.identity, origin.index, name, origin.lines
        )
    site_ = user[0] if user else (first_site or "<unknown>:0")
    return LoaderRecord(index, site_, (*framework, *user) or (site_,), None, name, tuple(lines))


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


def same_key(a: Sequence[str], b: Sequence[str], *, user_frames: int | None = None) -> bool:
    """Two keys name the same loader: the framework's functions equal, and the user's frames at
    the same lines of the same files (or paths that end the same: another working folder); only
    the innermost ``user_frames`` of those when given (the loader's line and the one that led to
    it tell loaders apart; the lines further out change with every edit of the script)."""
    framework_a, user_a = _split(a, user_frames)
    framework_b, user_b = _split(b, user_frames)
    return (
        framework_a == framework_b
        and len(user_a) == len(user_b)
        and all(x == y or matches_site(x, y) for x, y in zip(user_a, user_b, strict=True))
    )


def same_code(
    a: Sequence[str], a_lines: Sequence[str], b: Sequence[str], b_lines: Sequence[str]
) -> bool | None:
    """Whether two keys name the same code, wherever its lines are now: the framework's
    functions equal, and the two innermost of the user's frames (the loader's line and the one
    that led to it, as :func:`same_key` compares) in files of the same name, reading the same
    (``a_lines`` and ``b_lines``: :attr:`LoaderRecord.lines`). None when a text is unknown
    (a file that could not be read, an entry saved before texts were)."""
    framework_a, user_a = _split(a, 2)
    framework_b, user_b = _split(b, 2)
    texts_a, texts_b = list(a_lines[: len(user_a)]), list(b_lines[: len(user_b)])
    if len(texts_a) < len(user_a) or len(texts_b) < len(user_b) or not all(texts_a + texts_b):
        return None
    files = [os.path.basename(x.rpartition(":")[0]) for x in user_a]
    return (
        framework_a == framework_b
        and files == [os.path.basename(y.rpartition(":")[0]) for y in user_b]
        and texts_a == texts_b
    )


def _split(key: Sequence[str], user_frames: int | None) -> tuple[list[str], list[str]]:
    """``key``'s framework functions, and its innermost ``user_frames`` user frames (all: None)."""
    return [x for x in key if not _is_line(x)], [x for x in key if _is_line(x)][:user_frames]


def _is_line(element: str) -> bool:
    """A user's frame (``file:line``), not a framework's function (``pkg/file.py:function``)."""
    return element.rpartition(":")[2].isdigit()


def names_site(record: LoaderRecord, wanted: str) -> bool:
    """``--loader FILE:LINE`` names this loader: its call site, or another of the user's frames
    that led to it (the line that calls a helper creating both loaders)."""
    if matches_site(record.call_site, wanted):
        return True
    return any(matches_site(site_, wanted) for site_ in record.identity if _is_line(site_))


_FOUND_BY = {
    "the optimizer": ", the loader that feeds the optimizer",
    "--loader": ", as --loader named it",
}


def target_line(
    *,
    index: object,
    call_site: object,
    dataset: object,
    batch_size: object,
    chosen_by: str | None = None,
    rebuilt: bool = False,
    recreated: bool = False,
    key: Sequence[str] = (),
) -> str:
    """Which loader is tuned, as the user knows it: ``DataLoader #2 at train.py:42 (dataset
    mypkg.Images, batch size 32), the loader that feeds the optimizer``."""
    n = ordinal(key)
    notes = "".join(
        f"; {note}"
        for flag, note in (
            (n > 1, f"the {nth(n)} DataLoader created at that line"),
            (rebuilt, "rebuilt by the framework"),
            (recreated, "created again at each epoch"),
        )
        if flag
    )
    how = _FOUND_BY.get(chosen_by or "", f", {chosen_by}" if chosen_by else "")
    size = batch_size if batch_size is not None else "?"
    return (
        f"DataLoader #{index} at {call_site} (dataset {dataset or '?'}, batch size {size}"
        f"{notes}){how}"
    )
