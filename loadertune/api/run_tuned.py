"""``loadertune run --tune``: run a training script for real, its saved settings applied where
its loaders are created, and its target loader tuned during the first ``budget_s`` seconds by a
:class:`~loadertune.api.live.Tuner` (see :mod:`loadertune.api.live` for how)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from loadertune.api import saved
from loadertune.api.live import Report, Tuner, live_settings
from loadertune.config import normalize_batch_sizes
from loadertune.errors import ConfigError, LoadertuneError
from loadertune.results import store
from loadertune.trials.inside.identity import target_line

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from loadertune.trials.inside.apply_saved import ApplySaved, SavedEntry
    from loadertune.trials.inside.identity import LoaderRecord
    from loadertune.trials.inside.patch import OriginalIter


FIRST_WITH_GRAD = "the first the script iterates with gradients on (`--loader N` picks another)"
# Iterated with gradients on before any optimizer existed (a sanity pass before training, or a
# loop that trains nothing), then again: see _TuneScript._first_training.
FIRST_AGAIN = (
    "the first the script iterates with gradients on, again before any optimizer exists "
    "(`--loader N` picks another)"
)


class _TuneScript:
    """The patch controller of ``loadertune run --tune``: the saved settings (if any) applied
    where the script creates its loaders (every loader's workers die with the run: ``apply``),
    and the target loader tuned when first iterated: the one ``loader`` names (its order of
    creation, or ``FILE:LINE``), else the saved entry's loader (``entry``), else the first
    iterated with gradients on (an evaluation before training, such as Lightning's sanity
    check, iterates its loader under ``torch.no_grad()`` or inference mode). Which one is
    said, as ``search`` says it."""

    def __init__(
        self,
        tuner: Tuner,
        apply: ApplySaved,
        loader: int | str | None,
        entry: SavedEntry | None = None,
    ) -> None:
        from loadertune.trials.inside.target import Selector

        self.tuner, self.apply, self.entry = tuner, apply, entry
        spec = {"index": loader} if isinstance(loader, int) else {"call_site": loader}
        self.selector = Selector(spec)  # names none without ``loader``
        self.target: LoaderRecord | None = None
        self._chosen_by = ""
        self._optimizer_seen = False  # an optimizer existed at an iteration (training is on)
        self._before_training: list[tuple[str, ...]] = []  # loaders iterated before it did

    def on_create(self, record: LoaderRecord, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.apply.on_create(record, arguments)

    def on_iter(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        if self.target is None and self._names(record):
            self.target = record
            self.tuner.runner.loader_info.update(
                loader_index=record.index,
                call_site=record.call_site,
                key=list(record.identity),
                lines=list(record.lines),
            )
            from loadertune.trials.hotswap.steps import why_not

            self.apply.report(
                ("loadertune: tuning " if why_not(loader) is None else "loadertune: found ")
                + target_line(
                    index=record.index,
                    call_site=record.call_site,
                    dataset=record.dataset,
                    batch_size=loader.batch_size
                    or getattr(loader.batch_sampler, "batch_size", None)
                    or ("None" if loader.batch_sampler is None else None),
                    chosen_by=self._chosen_by,
                    rebuilt=record.origin is not None,
                    key=record.identity,
                )
            )
        from loadertune.trials.inside.identity import same_key

        # (a loader the script creates again, every epoch, has the key of the one first tuned)
        if self.target is None or not same_key(record.identity, self.target.identity):
            from loadertune.measure.meter import elsewhere

            # a validation's pass is left out of the running setting's window
            meter = self.tuner.swap.active()[0] if self.tuner.swap is not None else None
            from loadertune.trials.loader import epoch_batches

            return elsewhere(original(loader), meter, epoch_batches(loader))
        return self.tuner.epoch(loader, original)

    def none_tuned(self) -> str:
        """Why the run tuned no loader, in a line."""
        made = "; ".join(r.describe() for r in self.apply.created) or "none"
        if self.selector.named:
            wanted = self.selector.call_site or f"#{self.selector.index}"
            why = f"no DataLoader the script iterated is {wanted} (it created: {made})"
        else:
            why = f"the script iterated no DataLoader (it created: {made})"
        return f"loadertune: nothing was tuned: {why}"

    def _names(self, record: LoaderRecord) -> bool:
        import torch

        if self.selector.named:
            self._chosen_by = "--loader"
            return self.selector.names(record)
        if self.entry is not None and self.entry.differs(record, moved=True) is None:
            self._chosen_by = f"the loader {self.entry.name} was measured on"
            return True
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return False  # an evaluation (Lightning's sanity check before training): not this
        if self.entry is None:
            return self._first_training(record)
        if any(self.entry.differs(r, moved=True) is None for r in self.apply.created):
            return False  # the entry's loader exists: it is the one to tune, when iterated
        # The entry matches no loader the script created (the script changed since it was
        # measured): tune the first iterated, as without an entry, and say so.
        self.apply.report(
            f"loadertune: no DataLoader of this run is the one {self.entry.name} was measured "
            f"on {self.entry.where()}; tuning the first the script iterates with gradients on"
        )
        self.entry = None
        return self._first_training(record)

    def _first_training(self, record: LoaderRecord) -> bool:
        """Whether ``record``'s loader, iterated with gradients on, is the one to tune: yes once
        an optimizer exists (training is on); before any does, only when iterated again (a
        loop that trains nothing), so that a sanity pass over the validation loader with
        gradients on, before the script makes its optimizer, is not tuned in place of the
        training loader (``search`` finds the loader that feeds the optimizer, by its
        steps)."""
        from loadertune.trials.inside.identity import same_key
        from loadertune.trials.inside.target import optimizer_exists

        if self._optimizer_seen or optimizer_exists():
            self._optimizer_seen = True
            self._chosen_by = FIRST_WITH_GRAD
            return True
        if any(same_key(record.identity, key) for key in self._before_training):
            self._chosen_by = FIRST_AGAIN
            return True
        self._before_training.append(record.identity)
        return False


def run_script_tuned(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    path: str | os.PathLike[str] = "loadertune.json",
    budget_s: float = 60.0,
    batch_size: int | Sequence[int] | None = None,
    loader: int | str | None = None,
    report: Report = print,
) -> int:
    """Run a training script for real, tuning its DataLoader during the first ``budget_s``
    seconds (what ``loadertune run --tune`` does); the winner is saved to ``path``.

    The run starts with this machine's saved settings for the script, if ``path`` has them, else
    with the script's own. ``loader``: which DataLoader (order of creation, or ``"FILE:LINE"``;
    default: the saved entry's, else the first the script iterates). Returns the script's exit
    status; the script's own exceptions propagate.
    """
    from loadertune.trials.inside.apply_saved import ApplySaved
    from loadertune.trials.script.runner import check_script

    check_script(script)
    if not budget_s > 0:
        raise ConfigError(f"budget_s must be > 0 seconds, but got {budget_s!r}.")
    try:  # a winner that cannot be saved is not worth the run's time (nor its risk)
        store.read(path)
        store.check_writable(path, option="--file")
    except LoadertuneError as exc:
        report(f"loadertune: not tuning this run, whose winner could not be saved: {exc}")
        plain = ApplySaved([], report=report)  # every loader's workers die with the run still
        return saved.run_patched(plain, script, args, report, plain.unapplied)
    try:
        apply = saved.apply_saved(script, path, report)
    except LoadertuneError as exc:
        why = (
            f"{path} does not exist yet; the winner is saved there"
            if not os.path.exists(path)
            else str(exc)
        )
        report(f"loadertune: starting with the script's own settings: {why}")
        apply = ApplySaved([], report=report)  # every loader's workers die with the run still
    entry = apply.entries[0] if len(apply.entries) == 1 else None
    sizes = () if batch_size is None else normalize_batch_sizes(batch_size)
    ident = hashlib.sha1(
        f"{os.path.abspath(script)}|{list(args)}|{loader}|{list(sizes)}".encode()
    ).hexdigest()[:10]
    tuner = Tuner(
        settings=live_settings(None, budget_s, f"run-{os.path.basename(str(script))}-{ident}"),
        batch_sizes=sizes,
        out=path,
        workload={"kind": "script", "script": str(script), "args": list(args)},
        report=report,
    )
    controller = _TuneScript(tuner, apply, loader, entry)

    def said_at_end() -> list[str]:
        return apply.unapplied() + ([controller.none_tuned()] if controller.target is None else [])

    try:
        return saved.run_patched(controller, script, args, report, said_at_end)
    except KeyboardInterrupt:
        tuner.interrupted = True
        raise
    finally:
        tuner.finish()
