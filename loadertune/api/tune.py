"""Search for settings: ``tune_loader`` (a dataset and a step, trials in this process) and
``tune_script`` (an unmodified script, trials in its own processes).

Each entry point checks its inputs, builds one :class:`~loadertune.search.SearchSettings`, hands
a trial runner to the search, and turns the outcome into a
:class:`~loadertune.results.recommendation.Recommendation`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from loadertune import hardware
from loadertune.config import TUNED_KEYS, Config, check_max_workers, normalize_batch_sizes
from loadertune.errors import (
    ConfigError,
    SearchInterrupted,
    UserCodeError,
)
from loadertune.hardware import Hardware
from loadertune.results.recommendation import (
    Recommendation,
    build_recommendation,
    interrupted_as_it_finished,
)
from loadertune.search import Observer, Search, SearchSettings
from loadertune.trials import TrialRunner, leftovers

if TYPE_CHECKING:
    from loadertune.trials.script.runner import ScriptRunner

DEFAULT_BATCH_SIZE = 32  # the baseline's batch size when the user names none


_LOADER_PARAMS = set(inspect.signature(DataLoader.__init__).parameters) - {"self", "dataset"}


def _check_fixed(loader_kwargs: Mapping[str, Any]) -> None:
    tuned = sorted(set(loader_kwargs) & set(TUNED_KEYS))
    if tuned:
        raise ConfigError(
            f"{', '.join(tuned)} {'is' if len(tuned) == 1 else 'are'} what loadertune tunes; pass "
            "your current values as baseline={...} to compare against them, batch_size= for the "
            "candidates, and max_workers= to bound num_workers."
        )
    unknown = sorted(set(loader_kwargs) - _LOADER_PARAMS)
    if unknown:
        raise ConfigError(
            f"unknown DataLoader argument(s) {unknown}; DataLoader takes {sorted(_LOADER_PARAMS)}."
        )


def _check_dataset(dataset: object, loader_kwargs: Mapping[str, Any]) -> None:
    """A ConfigError unless DataLoader can load ``dataset``: an IterableDataset, or an object
    with ``__getitem__`` and (unless a sampler is passed) ``__len__``, as a Dataset, a list or
    an array has."""
    if isinstance(dataset, IterableDataset):
        return
    kind = type(dataset)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if not hasattr(kind, "__getitem__"):
        raise ConfigError(
            f"dataset is a {name} object, not a Dataset: pass a torch.utils.data.Dataset "
            "(with __getitem__ and __len__) or an IterableDataset (with __iter__)."
        )
    if not hasattr(kind, "__len__") and not (
        loader_kwargs.get("sampler") or loader_kwargs.get("batch_sampler")
    ):
        raise ConfigError(
            f"dataset ({name}) has no __len__, which DataLoader's default sampler needs: "
            "define __len__, pass sampler= or batch_sampler=, or make it an IterableDataset."
        )


def _user_batch_size(
    batch_size: int | Sequence[int] | None, baseline: Mapping[str, Any] | None
) -> int:
    if baseline and baseline.get("batch_size") is not None:
        return int(baseline["batch_size"])
    if isinstance(batch_size, int):
        return batch_size
    if batch_size:
        return int(next(iter(batch_size)))
    return DEFAULT_BATCH_SIZE


def _workload_id(dataset: Any, step: Callable[..., Any] | None, batch_sizes: Sequence[int]) -> str:
    cls = type(dataset)
    try:
        length: Any = len(dataset)
    except TypeError:
        length = "iterable"
    step_name = getattr(step, "__qualname__", step)
    text = f"{cls.__module__}.{cls.__qualname__}|{length}|{step_name}|{list(batch_sizes)}"
    return f"tune_loader-{cls.__name__}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def run_search(
    runner: TrialRunner,
    *,
    baseline: Config | None,
    batch_sizes: Sequence[int],
    settings: SearchSettings,
    observer: Observer | None,
    hw: Hardware,
    workload: dict[str, Any],
    hide_batch_size: bool = False,
) -> Recommendation:
    """Search with ``runner`` and build the recommendation; the runner is closed after.

    Ctrl-C or SIGTERM once the search is over (the runner closing, the recommendation being
    built) is the same :class:`SearchInterrupted` as during it, with the winner as the best so
    far; the runner is closed all the same."""
    leftovers.sweep()  # what an earlier search or run, killed, left in /tmp
    try:
        outcome = Search(
            runner,
            hardware=hw,
            baseline=baseline,
            batch_sizes=batch_sizes,
            settings=settings,
            observer=observer,
        ).run()
    except UserCodeError as exc:
        # The user's bug: its text holds their traceback; loadertune's way down to the trial
        # that met it is noise in front of it.
        raise exc.with_traceback(None) from None
    finally:
        stopped = _close(runner)  # an exception on its way out goes on
    try:
        if stopped is not None:
            raise stopped
        return build_recommendation(outcome, hw, workload=workload, hide_batch_size=hide_batch_size)
    except KeyboardInterrupt as exc:
        raise interrupted_as_it_finished(outcome) from exc


def _close(runner: TrialRunner) -> KeyboardInterrupt | None:
    """Close ``runner`` even when Ctrl-C or SIGTERM lands meanwhile (its processes must not
    outlive the search); the interrupt is handed back, to be raised once it is closed."""
    stopped = None
    for _ in range(3):
        try:
            runner.close()
            return stopped
        except KeyboardInterrupt as exc:
            stopped = exc
    return stopped


def resolved_settings(settings: SearchSettings, hw: Hardware, *, study_name: str) -> SearchSettings:
    """``settings`` checked against this machine, with the workload's study name unless one was
    given."""
    check_max_workers(settings.max_workers, hw.logical_cpus)
    if settings.study_name:
        return settings
    return dataclasses.replace(settings, study_name=study_name)


def tune_loader(
    dataset: Dataset[Any],
    *,
    batch_size: int | Sequence[int] | None = None,
    step: Callable[[Any], Any] | None = None,
    budget_s: float = 60.0,
    n_trials: int | None = None,
    max_workers: int | None = None,
    baseline: Mapping[str, Any] | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    resume: bool = True,
    window_s: float | None = None,
    memory_budget_fraction: float = 0.8,
    seed: int | None = None,
    verbose: bool = True,
    **loader_kwargs: Any,
) -> Recommendation:
    """Find the fastest DataLoader settings for ``dataset`` (and ``step``) on this machine.

    Trials run in this process, over real multi-worker DataLoaders; each trial warms up, then
    measures a window of the loop ``for batch in loader: step(batch)``.

    Args:
        dataset: the dataset to load (map-style or iterable).
        batch_size: an int to keep fixed, a list of candidates, or None for powers of two.
        step: your training step, ``step(batch)``; None tunes loading alone (with CUDA, the
            batch is then copied to the GPU). It runs on every trial's batches: a step that
            updates a model trains it during the search (pass a copy, or restore its state).
        budget_s: wall-clock cap of the whole call, in seconds.
        n_trials: cap on the settings measured (None: the budget decides).
        max_workers: highest ``num_workers`` to try (None: derived from CPUs and memory).
        baseline: your current settings (DataLoader keywords), measured beside the winner;
            default: PyTorch's defaults at your batch size.
        storage: an Optuna storage URL for the study (None: SQLite in the user cache directory).
        study_name: the study's name (None: derived from the dataset, step and batch sizes);
            calling again with the same name resumes it.
        resume: False starts the study afresh.
        window_s: measured window per trial (None: derived from the budget).
        memory_budget_fraction: share of available RAM the trials' workers may use.
        seed: seed of Optuna's sampler.
        verbose: print a live view and the result table.
        **loader_kwargs: your other DataLoader arguments (``collate_fn``, ``sampler``,
            ``shuffle``, ``drop_last``, ``worker_init_fn``...), passed through untouched.

    Returns:
        The :class:`Recommendation`; ``rec.loader_kwargs`` splats into ``DataLoader``.

    Example:
        >>> rec = tune_loader(dataset, batch_size=[32, 64], step=train_step, budget_s=60)
        >>> loader = DataLoader(dataset, **rec.loader_kwargs, collate_fn=my_collate)
        >>> rec.save("loadertune.json")
    """
    from loadertune.trials.inline import InlineRunner  # imports torch's DataLoader machinery

    _check_fixed(loader_kwargs)
    _check_dataset(dataset, loader_kwargs)
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        n = None
    if n == 0:
        raise ConfigError("the dataset is empty (len(dataset) == 0); there is nothing to load.")
    hw = hardware.detect()
    if baseline is not None:
        _check_baseline(baseline)
    user_bs = _user_batch_size(batch_size, baseline)
    sizes = normalize_batch_sizes(batch_size)
    base = Config.from_kwargs(baseline or {}, batch_size=user_bs)
    settings = resolved_settings(
        SearchSettings(
            budget_s=budget_s,
            n_trials=n_trials,
            window_s=window_s,
            max_workers=max_workers,
            memory_budget_fraction=memory_budget_fraction,
            seed=seed,
            storage=storage,
            resume=resume,
            study_name=study_name,
        ),
        hw,
        study_name=_workload_id(dataset, step, sizes),
    )
    runner = InlineRunner(dataset, step=step, fixed=loader_kwargs)
    observer = None
    if verbose:
        from loadertune.view.progress import LiveView

        observer = LiveView()
    workload = {
        "kind": "dataset",
        "dataset": f"{type(dataset).__module__}.{type(dataset).__qualname__}",
        "step": getattr(step, "__qualname__", None),
        "epoch_samples": runner.epoch_samples,
    }
    with observer or contextlib.nullcontext():
        rec = run_search(
            runner,
            baseline=base,
            batch_sizes=sizes,
            settings=settings,
            observer=observer,
            hw=hw,
            workload=workload,
            hide_batch_size="batch_sampler" in loader_kwargs,
        )
    if verbose:
        from loadertune.view.summary import print_summary

        print_summary(rec)
    return rec


def tune_script(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    batch_size: int | Sequence[int] | None = None,
    loader: int | str | None = None,
    settings: SearchSettings | None = None,
    observer: Observer | None = None,
    nproc_per_node: int | None = None,
) -> Recommendation:
    """Tune the DataLoader of an unmodified training script (what ``loadertune search`` runs).

    Each trial runs ``python SCRIPT ARGS`` in a fresh process group with the trial's settings
    applied to the chosen loader, measures the script's own loop, and ends the script.

    Args:
        script: the training script.
        args: its arguments.
        batch_size: candidates to search; None keeps the script's own batch size.
        loader: which loader: its order of creation (1 = first), ``"FILE:LINE"``, or None for
            the first one the script iterates.
        settings: budget and policy of the search (None: the defaults); without a
            ``study_name`` the study is named after the script, its arguments and the loader.
        observer: hears progress (the CLI's live view); None is silent.
        nproc_per_node: run every trial under torch's launcher with this many ranks (a script
            that calls ``init_process_group``, as ``torchrun --nproc-per-node N`` runs it); the
            rate is the node's, as the slowest rank allows. None: one plain process.

    Example:
        >>> rec = tune_script("train.py", ["--epochs", "3"], settings=SearchSettings(budget_s=60))
        >>> rec.save("loadertune.json")
    """
    from loadertune.trials.script.ranks import RankedScriptRunner
    from loadertune.trials.script.runner import ScriptRunner

    hw = hardware.detect()
    sizes = () if batch_size is None else normalize_batch_sizes(batch_size)
    runner = (
        ScriptRunner(script, list(args), loader=loader)
        if nproc_per_node is None
        else RankedScriptRunner(script, list(args), loader=loader, nproc_per_node=nproc_per_node)
    )
    ranks = nproc_per_node or 1
    ident = hashlib.sha1(
        f"{os.path.abspath(script)}|{list(args)}|{loader}|{list(sizes)}|{nproc_per_node}".encode()
    ).hexdigest()[:10]
    # The fork server's imports (torch, the script's packages) run while the search sets up.
    runner.start_server()
    try:
        settings = resolved_settings(
            dataclasses.replace(settings or SearchSettings(), ranks=ranks),
            hw,
            study_name=f"script-{os.path.basename(str(script))}-{ident}",
        )
    except BaseException:
        runner.close()  # (run_search closes it from here on)
        raise
    workload = {
        "kind": "script",
        "script": str(script),
        "args": list(args),
        "world_size": ranks,
        "nproc_per_node": nproc_per_node,
    }

    try:
        rec = run_search(
            runner,
            baseline=None,
            batch_sizes=sizes,
            settings=settings,
            observer=observer,
            hw=hw,
            workload=workload,
        )
    except SearchInterrupted as exc:  # what was tuned, for save_partial's entry
        exc.workload = {**workload, **_found(runner)}
        raise
    rec.workload.update(_found(runner))
    if runner.batch_size_fixed:  # the script's batch sampler decides: no batch size to say
        rec.loader_kwargs.pop("batch_size", None)
        rec.baseline_kwargs.pop("batch_size", None)
    return rec


def _found(runner: ScriptRunner) -> dict[str, Any]:
    """What a script's trials found of the loader they tuned, for the recommendation's workload."""
    info = runner.loader_info or {}
    return {
        "loader_index": info.get("index"),
        "call_site": info.get("call_site"),
        "key": info.get("key"),
        "lines": info.get("lines"),
        "dataset": info.get("dataset"),
        "chosen_by": info.get("chosen_by"),
        "rebuilt_by_framework": info.get("origin") is not None,
        "recreated_each_epoch": runner.loader_recreated,
        "batch_size_fixed": runner.batch_size_fixed,
        "epoch_samples": runner.epoch_samples or info.get("epoch_samples"),
    }


def _check_baseline(baseline: Mapping[str, Any]) -> None:
    unknown = sorted(set(baseline) - set(TUNED_KEYS))
    if unknown:
        raise ConfigError(
            f"baseline takes only {list(TUNED_KEYS)}, but got {unknown}; pass the "
            "other DataLoader arguments to tune_loader itself."
        )
