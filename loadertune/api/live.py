"""Tuning inside the real training run: :func:`tuned`, and the tuner under ``loadertune run
--tune`` (:mod:`loadertune.api.run_tuned`).

The training starts with the saved settings (``loadertune run --tune``) or its own, and its first
``budget_s`` seconds double as the search: the same search as ``loadertune search`` (baseline,
probe, exploration, interleaved confirmation; no replay), in a thread of the training process,
each setting measured on the training loop itself (:mod:`loadertune.trials.hotswap.live_runner`).
The batch size stays the loop's own unless ``batch_sizes`` allows others (a batch size changes the
optimisation: scale the learning rate with it), and from the moment the script asks the
loader's length (a schedule or a step count sized by it: ``LiveConductor._length_asked``). Then
the winner runs to the end of the training and is saved to the recommendation file under this
machine's key, where ``loadertune run`` and :func:`~loadertune.load_recommendation` find it.
Every batch is a real training batch, each sample handed over once per epoch (see
:mod:`loadertune.trials.hotswap.swap` for how, and what differs from an untuned run); a failing
setting gives way to the last good one; a bad record that setting cannot load either goes to the
loop, as torch raises it, and the trial goes on (``HotSwap._bad_record``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from loadertune import hardware
from loadertune.api import saved, tune
from loadertune.config import Config, normalize_batch_sizes
from loadertune.errors import ConfigError, LoadertuneError, SearchInterrupted
from loadertune.search import SearchSettings
from loadertune.trials import TrialResult
from loadertune.view.progress import trial_line
from loadertune.view.summary import noise_words

if TYPE_CHECKING:  # torch's DataLoader machinery is imported when a tuning starts
    from torch.utils.data import DataLoader

    from loadertune.trials.hotswap.swap import HotSwap
    from loadertune.trials.inside.patch import OriginalIter

Report = Callable[[str], None]


class _Lines:
    """The search's observer during a training run: one line per trial (the training prints
    too, so no live view)."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def search_started(self, deadline: float, budget_s: float) -> None:
        self.report(f"loadertune: tuning the DataLoader on this run for up to {budget_s:.0f} s")

    def phase(self, name: str) -> None:
        pass

    def trial_started(self, config: Config | None, phase: str) -> None:
        pass

    def trial_finished(self, result: TrialResult, best: TrialResult | None) -> None:
        self.report(f"loadertune: {trial_line(result)}")

    def note(self, text: str) -> None:
        self.report(f"loadertune: {text}")


class Tuner:
    """One tuning of one loader during a training run. See the module docstring.

    Args:
        settings: the search's budget and policy (its ``budget_s`` is the tuning's).
        batch_sizes: other batch sizes the search may pick (empty: the loop's own only).
        out: the recommendation file the winner is saved to.
        workload: what is tuned (the recommendation's workload; the loader's facts are added).
        report: where lines go.
    """

    def __init__(
        self,
        *,
        settings: SearchSettings,
        batch_sizes: Sequence[int] = (),
        out: str | os.PathLike[str] = "loadertune.json",
        workload: dict[str, Any],
        report: Report = print,
    ) -> None:
        self.settings = settings
        self.batch_sizes = tuple(batch_sizes)
        self.out = out
        self.workload = workload
        self.report = report
        from loadertune.trials.hotswap.live_runner import LiveConductor, LiveRunner

        self.runner = LiveRunner()
        self.conductor = LiveConductor(self.runner, report)
        self.swap: HotSwap | None = None
        self.untuned = False  # the loader cannot change setting mid-epoch: left as it is
        self.saved_to: str | None = None
        self.interrupted = False  # the run ended by Ctrl-C (or SIGTERM), not by itself
        self._thread: threading.Thread | None = None

    def epoch(self, loader: DataLoader[Any], original: OriginalIter | None = None) -> Iterator[Any]:
        """What iterating ``loader`` returns: the first call starts the tuning."""
        from loadertune.trials import loader as dl
        from loadertune.trials.hotswap.steps import why_not
        from loadertune.trials.hotswap.swap import HotSwap

        if self.swap is None and not self.untuned:
            why = why_not(loader) or self._shared_handles(loader)
            if why is not None:
                self.untuned = True
                self.report(
                    f"loadertune: not tuning this DataLoader during the run: {why}; a side "
                    "search tunes it instead, a fresh loader per setting (`loadertune search "
                    "SCRIPT`, or `tune_loader` in code), and `loadertune run` applies what it "
                    "saved"
                )
            else:
                self.swap = HotSwap(loader, self.conductor, fall_back=True, drain=True)
                self.conductor.attach(self.swap)
                self._thread = threading.Thread(
                    target=self._search, name="loadertune-tuner", daemon=True
                )
                self._thread.start()
        if self.swap is not None and loader is not self.swap.loader:
            self._follow(loader)  # the script created its loader again
        if self.swap is None:
            return original(loader) if original is not None else iter(loader)
        lengths = self.runner.epoch_lengths
        lengths.close()  # (before the next epoch's workers start)
        return lengths.count(self.swap.epoch(), dl.batches_per_epoch(loader))

    def _shared_handles(self, loader: DataLoader[Any]) -> str | None:
        """Why the run must keep its ``num_workers=0``: forked workers would share the
        dataset's open files or connections (:mod:`loadertune.trials.handles`), and a training
        that is right without workers would read wrong records with them. A run with workers
        of its own, or a ``worker_init_fn`` (which may open them again), is told and tuned."""
        from loadertune.trials import handles, lifeline

        held = handles.forked_handles(loader.dataset, loader.multiprocessing_context)
        if not held:
            return None
        if loader.num_workers or lifeline.users_worker_init(loader.worker_init_fn) is not None:
            self.report(f"loadertune: warning: {handles.loader_fork_warning(loader)}")
            return None
        return (
            f"its dataset holds {', '.join(held)}, made in the main process, which workers "
            "forked from it would share: their reads can return wrong records without an "
            "error. The run goes on with num_workers=0; open them in each worker (on first "
            "use in __getitem__) to let it tune"
        )

    def _follow(self, loader: DataLoader[Any]) -> None:
        """Tune ``loader``, the script's loader created again, from where the last one was; or,
        when it cannot be (another batch size: a schedule of batch sizes is the script's own),
        leave it and every later one as the script builds them, the search stopped there."""
        from loadertune.trials import loader as dl
        from loadertune.trials.hotswap.steps import why_not

        assert self.swap is not None
        why = why_not(loader)
        size, own = dl.settings_of(loader).batch_size, self.runner.own.batch_size
        if why is None and size != own:
            why = f"it was created again with batch size {size}, where the tuning began at {own}"
        if why is None:
            self.swap.follow(loader)
            return
        self.report(f"loadertune: not tuning this DataLoader from here on: {why}")
        self.untuned = True
        self.runner.end()  # the search stops as at the run's end (the best so far is kept)
        self.swap.close()
        self.swap = None

    def _search(self) -> None:
        """The search, in its own thread; the winner goes to the loop and to the file."""
        workload = {**self.workload, **self._found()}
        try:
            rec = tune.run_search(
                self.runner,
                baseline=None,
                batch_sizes=self.batch_sizes,
                settings=self.settings,
                observer=_Lines(self.report),
                hw=hardware.detect(),
                workload=workload,
            )
        except SearchInterrupted as exc:  # the run ended first
            exc.workload = workload
            self._save_partial(exc)
        except LoadertuneError as exc:
            self.report(f"loadertune: the tuning stopped: {exc}; the run goes on as it is")
        else:
            at_own = rec.best_at_batch_size
            if at_own is not None:  # set before the winner, which the loop reads first
                self.runner.best_at_own = Config.from_kwargs(at_own["loader_kwargs"])
            self.runner.winner = Config.from_kwargs(
                rec.loader_kwargs, batch_size=self.runner.own.batch_size
            )
            rec.workload.update(self._found())
            try:
                self.saved_to = str(rec.save(self.out))
            except LoadertuneError as exc:
                self.report(f"loadertune: could not save the winner: {exc}")
            noise = noise_words({"within_noise": rec.within_noise, "unconfirmed": rec.unconfirmed})
            noise = f" ({noise})" if noise else ""
            speedup = f", {rec.speedup:.2f}x per epoch{noise}" if rec.speedup else ""
            self.report(
                f"loadertune: tuned in {rec.search.get('elapsed_s', 0):.0f} s "
                f"({len(rec.trials)} trials): {self.runner.winner.label()}{speedup}"
                f"{'; saved to ' + self.saved_to if self.saved_to else ''}; "
                "the run goes on with it"
            )

    def _found(self) -> dict[str, Any]:
        info = self.runner.loader_info
        keys = ("loader_index", "call_site", "key", "lines", "dataset", "epoch_samples")
        return {k: info.get(k) for k in keys}

    def _save_partial(self, exc: SearchInterrupted) -> None:
        # (untuned: the loop's loader could no longer be tuned, said when it happened)
        ended = "the tuning stopped early" if self.untuned else "the run ended before the tuning"
        if self.interrupted:
            ended = "the run was interrupted before the tuning ended"
        try:
            self.saved_to = saved.save_partial(self.out, exc, run_ended=not self.interrupted)
        except LoadertuneError as err:
            self.report(f"loadertune: {ended}; {err}")
            return
        kept = f"; the best so far saved to {self.saved_to}, marked partial"
        self.report(f"loadertune: {ended}{kept if self.saved_to else ''}")

    def finish(self, timeout_s: float = 60.0) -> None:
        """The run is over (main thread): stop the search if it still runs (the best so far is
        saved, marked partial), and shut the last setting's workers down."""
        self.runner.end()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.conductor.close()
        if self.swap is not None:
            self.swap.close()
        self.runner.idle()  # the study's write, put off until the training was over


class TunedLoader:
    """A DataLoader that tunes itself during the first part of the run (see :func:`tuned`).

    Iterate it as the loader itself; other attributes are the loader's.
    """

    def __init__(self, loader: DataLoader[Any], tuner: Tuner) -> None:
        self.loader = loader
        self.tuner = tuner

    def __iter__(self) -> Iterator[Any]:
        return self.tuner.epoch(self.loader)

    def __len__(self) -> int:
        from loadertune.trials.inside.patch import mark_length_asked

        mark_length_asked(self.loader)  # the batch size stays the loader's own from now on
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def close(self) -> None:
        """End the tuning now if it still runs, and shut the workers down."""
        self.tuner.finish()

    def __enter__(self) -> TunedLoader:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is KeyboardInterrupt:
            self.tuner.interrupted = True
        self.close()


def tuned(
    loader: DataLoader[Any],
    *,
    budget_s: float = 60.0,
    batch_size: int | Sequence[int] | None = None,
    out: str | os.PathLike[str] = "loadertune.json",
    settings: SearchSettings | None = None,
    report: Report = print,
) -> TunedLoader:
    """``loader``, tuned during the first ``budget_s`` seconds of the loop that iterates it.

    Args:
        loader: the training loader, as you built it.
        budget_s: seconds of the run spent trying settings (every batch still trains).
        batch_size: other batch sizes the search may pick (None: keep the loader's own).
        out: where the winner is saved (this machine's entry for this dataset).
        settings: the search's policy (its ``budget_s`` is replaced by ``budget_s``, and it
            runs as a live search: see ``SearchSettings.live``).
        report: where progress lines go.

    Example:
        >>> with tuned(DataLoader(dataset, batch_size=64, shuffle=True), budget_s=60) as loader:
        ...     for epoch in range(10):
        ...         for batch in loader:
        ...             train_step(batch)
    """
    if not budget_s > 0:
        raise ConfigError(f"budget_s must be > 0 seconds, but got {budget_s!r}.")
    kind = type(loader.dataset)
    sizes = () if batch_size is None else normalize_batch_sizes(batch_size)
    study = f"tuned-{kind.__name__}-{hashlib.sha1(repr(sizes).encode()).hexdigest()[:8]}"
    tuner = Tuner(
        settings=live_settings(settings, budget_s, study),
        batch_sizes=sizes,
        out=out,
        workload={"kind": "dataset", "dataset": f"{kind.__module__}.{kind.__qualname__}"},
        report=report,
    )
    return TunedLoader(loader, tuner)


def live_settings(settings: SearchSettings | None, budget_s: float, study: str) -> SearchSettings:
    base = settings or SearchSettings()
    return tune.resolved_settings(
        dataclasses.replace(base, budget_s=budget_s, resume=False, live=True),
        hardware.detect(),
        study_name=study,
    )
