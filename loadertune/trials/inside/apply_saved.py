"""Saved settings applied to a script's own loaders (``loadertune run``), only where they belong.

An entry of the recommendation file says which loader it was measured on: the script (the
file's workload key, checked by the caller), the loader's key and call site
(:mod:`loadertune.trials.inside.identity`), and its dataset's class. :class:`ApplySaved` builds
every loader that matches an entry with that entry's settings (a loader created again at each epoch,
or rebuilt by a framework, matches each time) and leaves every other loader alone. A loader
created at an entry's line that differs otherwise (another dataset, reached another way: other
framework functions, or another line calling the one that creates it) is named, with what
differs, and not changed (once per reason: the Hugging Face ``Trainer`` creates and rebuilds an
evaluation loader at every evaluation); an entry that matched nothing is named at the end,
with the loaders the script did create. Every loader's workers, changed or not, die with the run
however it dies (:mod:`loadertune.trials.lifeline`), as a trial's do.

An edit above a loader moves its lines: an entry still names it when the loader's line and the
one that led to it read as they did when it was measured (:func:`~loadertune.trials.inside.identity.
same_code`; the run says where it was measured). A loader that matches an entry at its own lines
takes that entry before one that matches only by text (an entry the search saved after the edit
wins over the older one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader

from loadertune.config import Config, kwargs_label
from loadertune.hardware import usable_cpus
from loadertune.results import store
from loadertune.trials import lifeline
from loadertune.trials import loader as dl
from loadertune.trials.inside.identity import (
    LoaderRecord,
    matches_site,
    nth,
    ordinal,
    same_code,
    same_key,
)
from loadertune.trials.inside.patch import OriginalIter


@dataclass
class SavedEntry:
    """One entry's settings and the loader it was measured on."""

    name: str  # the entry's workload key, for messages
    loader_kwargs: dict[str, Any]
    call_site: str | None = None
    key: tuple[str, ...] | None = None
    dataset: str | None = None
    index: int | None = None  # order of creation (entries that record nothing else)
    lines: tuple[str, ...] = ()  # the text of the key's user frames (LoaderRecord.lines)
    partial: str | None = None  # why it is a best-so-far, not a finished search's winner
    # the search's winner, where it changed the batch size within the noise of the script's own
    # settings and the best at the script's batch size is applied instead (its label)
    passed_over: str | None = None
    applied: list[LoaderRecord] = field(default_factory=list)

    @classmethod
    def from_entry(cls, name: str, entry: dict[str, Any]) -> SavedEntry:
        workload = entry.get("workload")
        workload = workload if isinstance(workload, dict) else {}
        key = workload.get("key")
        lines = workload.get("lines")
        own = _at_own_batch_size(entry)
        return cls(
            name=name,
            loader_kwargs=dict(own or entry["loader_kwargs"]),
            passed_over=kwargs_label(entry["loader_kwargs"]) if own else None,
            call_site=workload.get("call_site") or None,
            key=tuple(key) if isinstance(key, list) and key else None,
            dataset=workload.get("dataset") or None,
            index=workload.get("loader_index") if not workload.get("call_site") else None,
            lines=tuple(lines) if isinstance(lines, list) else (),
            partial=store.partial_why(entry),
        )

    def differs(self, record: LoaderRecord, *, moved: bool = False) -> str | None:
        """Why ``record`` is not this entry's loader (None: it is); ``moved``: also when an edit
        has moved its lines (:meth:`moved_to`)."""
        if self.call_site is None:
            return None if record.index == (self.index or 1) else "another loader"
        at_site = matches_site(record.call_site, self.call_site)
        if not at_site and not (moved and self.moved_to(record)):
            return f"created at {record.call_site}, not {self.call_site}"
        if self.dataset and record.dataset and record.dataset != self.dataset:
            return f"it loads {record.dataset}, the entry was measured on {self.dataset}"
        if self.key is not None and ordinal(record.identity) != ordinal(self.key):
            return f"that was the {nth(ordinal(self.key))} created there"
        if self.key is None:
            return None
        same = same_code(record.identity, record.lines, self.key, self.lines)
        if same:  # the code decides, wherever its lines are now
            return None
        # Other code of the framework's (a Trainer's evaluation loader, built at the line of its
        # training loader) is another loader, not an edit, so "reads otherwise" is said only
        # where the framework's functions are the same:
        if (
            same is False
            and same_key(record.identity, self.key, user_frames=0)
            and same_key(record.identity, self.key, user_frames=2)
        ):
            return "its code reads otherwise now than when it was measured"
        # At other lines, reading otherwise: another call of the same helper (a validation
        # loader made by the training loader's function is not an edit of it), or an edit that
        # moved and changed the line: which lines, is what is known.
        if not same_key(record.identity, self.key, user_frames=2):
            pairs = zip(record.identity, self.key, strict=False)
            mine, theirs = next(((a, b) for a, b in pairs if a != b), ("another way", "another"))
            return f"it was created by {mine}, the entry's loader by {theirs}"
        return None

    def moved_to(self, record: LoaderRecord) -> bool:
        """``record`` is this entry's loader at other lines: its code reads as it did."""
        return (
            self.key is not None
            and not matches_site(record.call_site, self.call_site or "")
            and same_code(record.identity, record.lines, self.key, self.lines) is True
        )

    def label(self) -> str:
        return kwargs_label(self.loader_kwargs)

    def where(self) -> str:
        if self.call_site is None:
            return f"#{self.index or 1}"
        return f"at {self.call_site}" + (f" ({self.dataset})" if self.dataset else "")


def _at_own_batch_size(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The settings to apply in place of the entry's winner, or None: the best at the user's
    own batch size where the winner uses another and did not clearly beat the user's settings.
    A batch size changes the training (the learning rate goes with it), not only its speed,
    and within the noise nothing says it is faster, so one short window's figure must not
    change the batch size a run trains at. Settings the search did not measure are a hand
    edit of the file, applied as they are."""
    at_bs = entry.get("best_at_batch_size")
    kwargs = at_bs.get("loader_kwargs") if isinstance(at_bs, dict) else None
    winner = entry["loader_kwargs"]
    if not (entry.get("within_noise") and isinstance(kwargs, dict)):
        return None
    trials = entry.get("trials")
    if not any(isinstance(t, dict) and t.get("params") == winner for t in trials or []):
        return None
    size = kwargs.get("batch_size")
    if not isinstance(size, int) or size < 1 or size == winner.get("batch_size"):
        return None
    return kwargs


class ApplySaved:
    """A patch controller (:mod:`loadertune.trials.inside.patch`) applying saved entries to the
    loaders they were measured on; see the module docstring.

    Args:
        entries: this script's entries on this machine (none: every loader is left as it is,
            but for its workers' lifeline).
        report: called with one line per loader changed, or left alone at an entry's line.
    """

    def __init__(self, entries: list[SavedEntry], report: Callable[[str], None] = print) -> None:
        self.entries = entries
        self.report = report
        self.created: list[LoaderRecord] = []
        self._said: set[tuple[str, str]] = set()  # (entry, why not changed): said once
        self._told_cpus = False

    def on_create(self, record: LoaderRecord, arguments: dict[str, Any]) -> dict[str, Any]:
        self.created.append(record)
        arguments = lifeline.wrap_worker_init(arguments)  # its workers die with the run
        entry = self.entry_of(record)
        if entry is not None:
            return self._apply(entry, record, arguments)
        for entry in self.entries:
            why = entry.differs(record)
            if why is None:  # (entry_of found none)
                continue
            said = (entry.name, why)
            if entry.call_site and matches_site(record.call_site, entry.call_site):
                if said in self._said:
                    continue
                self._said.add(said)
                other = entry.key is not None and (  # another loader there, not an edit
                    ordinal(record.identity) != ordinal(entry.key)
                    or not same_key(record.identity, entry.key, user_frames=0)
                    or bool(entry.applied)  # its own loader was found in this run
                )
                hint = (
                    ""
                    if other
                    else " (if the script changed there, `loadertune search` measures it as it "
                    "is now)"
                )
                self.report(
                    f"loadertune: DataLoader {record.describe()} is not the loader {entry.name} "
                    f"was measured on ({why}); not changed{hint}"
                )
        return arguments

    def entry_of(self, record: LoaderRecord) -> SavedEntry | None:
        """The entry measured on ``record``: one at its own lines first, else one whose code
        an edit has moved; None."""
        for moved in (False, True):
            for entry in self.entries:
                if entry.differs(record, moved=moved) is None:
                    return entry
        return None

    def _apply(
        self, entry: SavedEntry, record: LoaderRecord, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        own = arguments.get("batch_size", 1)
        if not entry.applied:  # once: its re-creations and rebuilt copies get it silently
            moved = f" (measured at {entry.call_site})" if entry.moved_to(record) else ""
            size = entry.loader_kwargs.get("batch_size")
            if own and size is not None and size != own:  # the training changes, not only speed
                moved += (
                    f"; the batch size {size} is the search's pick, not the script's {own}: "
                    "scale the learning rate with it (linearly or by its square root)"
                )
            if entry.passed_over:
                moved += (
                    f"; the best at the script's batch size: the search's winner, "
                    f"{entry.passed_over}, changes the batch size and was within the noise of "
                    "the script's own settings (the training would change for no sure gain)"
                )
            if entry.partial:
                moved += (
                    f"; a best so far, not a finished search's winner ({entry.partial}): "
                    "`loadertune search` (or `run --tune`) measures it to the end"
                )
            self.report(f"loadertune: DataLoader {record.describe()}: {entry.label()}{moved}")
        elif (
            len(entry.applied) == 1
            and record.origin is None  # (a framework's rebuilt copy replaces it once)
            and entry.applied[0].origin is None
            and entry.loader_kwargs.get("persistent_workers")
        ):
            # A loader made again (each epoch): its persistent workers end with it. A short
            # search may see no second epoch, and so save them for such a loader.
            self.report(
                f"loadertune: DataLoader {record.describe()} is created again, so "
                "persistent_workers keeps no workers from one to the next: each starts its own "
                "(a DataLoader built once, before the epochs' loop, would keep them)"
            )
        entry.applied.append(record)
        config = Config.from_kwargs(entry.loader_kwargs, batch_size=own if own else 1)
        return dl.apply_settings(arguments, config)

    def on_iter(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        mine = [entry for entry in self.entries if record in entry.applied]
        if not mine:
            return original(loader)
        partial = any(entry.partial for entry in mine)
        # More workers than CPUs was measured fastest here: torch's warning against it (at the
        # iterator's creation) would contradict the measurement, so it is told once, not warned.
        cpus = usable_cpus()  # what torch's warning counts: the CPUs this process may run on
        if loader.num_workers > cpus and not self._told_cpus:
            self._told_cpus = True
            self.report(
                f"loadertune: {loader.num_workers} workers on {cpus} CPUs is the setting the "
                f"search saved for this machine{' (a best so far)' if partial else ''}; torch's "
                "warning against more workers than "
                "CPUs is left out for this loader"
            )
        with dl.quiet_worker_warning():
            return original(loader)

    def unapplied(self) -> list[str]:
        """One line per entry that matched no loader, naming the loaders the script created."""
        made = "; ".join(r.describe() for r in self.created) or "none"
        return [self._unapplied(entry, made) for entry in self.entries if not entry.applied]

    def _unapplied(self, entry: SavedEntry, made: str) -> str:
        at_site = entry.call_site is not None and any(
            matches_site(r.call_site, entry.call_site) for r in self.created
        )
        if not at_site:
            return (
                f"loadertune: the script created no DataLoader {entry.where()} for {entry.name}; "
                f"not applied (it created: {made})"
            )
        return (
            f"loadertune: {entry.name}: no DataLoader the script created matches the one "
            f"measured {entry.where()} (it created: {made}; how they differ is said above); not "
            "applied. Run `loadertune search` again to measure the script as it is now"
        )
