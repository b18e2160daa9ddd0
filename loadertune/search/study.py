"""The Optuna study a search persists into: the only place loadertune talks to Optuna.

Every trial the search measures lands in the study: explored settings through ask/tell, the
probe's and the confirmation's through ``add_trial``, with the full result in the user
attributes. The probe's estimates and the space are study attributes, so a later run of the same
study resumes where this one stopped, and the history can be read with Optuna's own tools
(``optuna-dashboard``, ``study.trials_dataframe()``). The opening's trials (baseline, probe,
replay) are also kept whole in a study attribute as each ends, with what the runner learnt from
them: they become Optuna trials only once the probe is done (their distributions are the space's,
which the probe decides), and a run interrupted before then must not lose them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from loadertune import signals
from loadertune.config import Config
from loadertune.errors import ConfigError, SearchInterrupted
from loadertune.search.probe import Estimates
from loadertune.search.space import SearchSpace
from loadertune.trials import TrialResult

OPENING = "opening"  # the study attribute that keeps the opening's trials (see keep_opening)
STARTED = "started"  # the study attribute that says when the study was created (UTC, ISO)
KEEP_REPLACED = 8  # replaced studies kept per name (see :func:`_replace`), the newest
_F = TypeVar("_F", bound=Callable[..., Any])


def _whole(method: _F) -> _F:
    """A write to the study is not cut in half by Ctrl-C or SIGTERM: the signal waits for the
    write's end (:func:`loadertune.signals.held`), then the handler in place runs as it would
    have (it raises KeyboardInterrupt, which the search turns into "interrupted, run it
    again"). Cut in half, the storage's commit fails with an error of its own, and that error,
    not the interruption, ended the search."""

    @functools.wraps(method)
    def whole(*args: Any, **kwargs: Any) -> Any:
        with signals.held():
            return method(*args, **kwargs)

    return whole  # type: ignore[return-value]


def _distributions(
    space: SearchSpace, config: Config, declared: Callable[[str, tuple[Any, ...]], tuple[Any, ...]]
) -> dict[str, BaseDistribution]:
    dists: dict[str, BaseDistribution] = {
        "batch_size": CategoricalDistribution(declared("batch_size", space.batch_sizes)),
        "num_workers": IntDistribution(0, space.max_workers),
        "pin_memory": CategoricalDistribution(declared("pin_memory", space.pin_memory)),
    }
    if config.num_workers:  # the conditional part of the space
        dists["prefetch_factor"] = CategoricalDistribution(
            declared("prefetch_factor", space.prefetch_factors)
        )
        dists["persistent_workers"] = CategoricalDistribution(
            declared("persistent_workers", space.persistent_workers)
        )
    return dists


def _params(config: Config) -> dict[str, Any]:
    kwargs = config.loader_kwargs()
    if not config.num_workers:
        kwargs.pop("persistent_workers")
    return kwargs


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna logs every trial at INFO; keep the terminal for our own view, and restore after."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(before)


@dataclass
class Previous:
    """What an earlier run of the same study left: its space, estimates and results."""

    space: SearchSpace
    estimates: Estimates | None
    values: dict[Config, float] = field(default_factory=dict)  # best value per setting
    failed: list[tuple[Config, str]] = field(default_factory=list)


class StudyLog:
    """One search's study.

    Args:
        storage: an Optuna storage URL.
        name: the study's name; an existing study of that name is resumed.
        resume: False deletes an existing study of that name first.
        seed: the sampler's seed.
        buffered: keep the study in memory and write it to ``storage`` in one go at
            :meth:`save` (a live run, with ``resume`` False: an SQLite storage's set-up and a
            commit per trial took 1.5 s of CPU in a 12-trial search, out of the training's).

    Raises:
        ConfigError: the storage cannot be opened, or the name belongs to another kind of study.
    """

    @_whole
    def __init__(
        self, storage: str, name: str, *, resume: bool, seed: int | None, buffered: bool = False
    ) -> None:
        self.storage, self.name = storage, name
        self._buffer = optuna.storages.InMemoryStorage() if buffered else None
        self.fresh = not resume  # an interrupt's advice: the same call would start afresh
        # TPE over the conditional space; multivariate+group model the parameters together.
        sampler = optuna.samplers.TPESampler(
            multivariate=True, group=True, seed=seed, n_startup_trials=5, constant_liar=False
        )
        try:
            if not resume and self._buffer is None:
                _replace(storage, name)
            self.study = optuna.create_study(
                storage=self._buffer or storage,
                study_name=name,
                sampler=sampler,
                direction="maximize",
                load_if_exists=True,
            )
            if STARTED not in self.study.user_attrs:
                self.study.set_user_attr(STARTED, _now())
        except ValueError as exc:  # a study of that name optimises something else
            raise ConfigError(
                f"study {name!r} in {storage} is not a loadertune study: {exc}"
            ) from exc
        except Exception as exc:  # sqlalchemy's ArgumentError, NoSuchModuleError, OperationalError
            raise ConfigError(
                f"storage={storage!r} is not a storage Optuna can open ({type(exc).__name__}: "
                f"{exc}). Pass a URL such as sqlite:///path/to/studies.db, or leave it out."
            ) from exc
        self._open: optuna.trial.Trial | None = None
        # each categorical's choices as this run first asked them (see ask)
        self._choices: dict[str, tuple[Any, ...]] = {}
        self.n_at_start = len(self.study.get_trials(deepcopy=False)) + self._n_unrecorded()

    @property
    def started(self) -> str | None:
        """When the study was created (UTC, ISO): a saved entry names its study by its name and
        this, so that a later fresh search of the same name does not take its place."""
        value = self.study.user_attrs.get(STARTED)
        return value if isinstance(value, str) else None

    # -- resuming --------------------------------------------------------------------------------

    @_whole
    def previous(self) -> Previous | None:
        """The state of an earlier run of this study (None if there was none). A trial left
        running by a run that died is closed as failed."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        attrs = self.study.user_attrs
        if "space" not in attrs:
            return None
        space_d = dict(attrs["space"])
        for key in ("batch_sizes", "prefetch_factors", "pin_memory", "persistent_workers"):
            space_d[key] = tuple(space_d[key])
        fields = {f.name for f in dataclasses.fields(Estimates)}
        saved = attrs.get("estimates")  # None: the probe could not estimate (a failed replay)
        prev = Previous(
            SearchSpace(**space_d),
            Estimates(**{k: v for k, v in saved.items() if k in fields}) if saved else None,
        )
        for t in self.study.get_trials(deepcopy=False):
            try:
                config = Config.from_kwargs(t.params)
            except (ConfigError, KeyError):
                continue
            if t.state == TrialState.COMPLETE and t.value is not None:
                prev.values[config] = max(t.value, prev.values.get(config, 0.0))
            elif t.state == TrialState.FAIL and t.user_attrs.get("error"):
                prev.failed.append((config, t.user_attrs["error"]))
        return prev

    @_whole
    def keep_opening(self, trials: list[TrialResult], runner_state: dict[str, Any]) -> None:
        """Keep the opening's trials so far, whole, and what the runner learnt from them."""
        self.study.set_user_attr(
            OPENING, {"trials": [t.to_dict() for t in trials], "runner": runner_state}
        )

    def kept_opening(self) -> tuple[list[TrialResult], dict[str, Any]]:
        """The opening's trials an earlier run kept (marked ``kept``), and the runner's state
        then; none when there was no earlier run, or it kept nothing this version can read."""
        kept = self.study.user_attrs.get(OPENING) or {}
        try:
            trials = [TrialResult.from_dict(t) for t in kept.get("trials", [])]
        except (ConfigError, KeyError, TypeError, ValueError):
            return [], {}
        for t in trials:
            t.kept = True
        return trials, dict(kept.get("runner") or {})

    def _n_unrecorded(self, *, ok: bool = False) -> int:
        """Kept opening trials not among the study's trials yet (the probe was not done);
        ``ok``: those that measured their setting only."""
        attrs = self.study.user_attrs
        kept = [] if "space" in attrs else (attrs.get(OPENING) or {}).get("trials", [])
        return sum(1 for t in kept if not ok or t.get("status") == "ok")

    @_whole
    def save_probe(self, space: SearchSpace, estimates: Estimates | None, baseline: Config) -> None:
        self.study.set_user_attr("space", dataclasses.asdict(space))
        self.study.set_user_attr("estimates", estimates.to_dict() if estimates else None)
        self.study.set_user_attr("baseline", baseline.loader_kwargs())

    # -- trials ----------------------------------------------------------------------------------

    @_whole
    def enqueue(self, config: Config) -> None:
        self.study.enqueue_trial(_params(config), skip_if_exists=True)

    @_whole
    def ask(self, space: SearchSpace) -> Config:
        """The sampler's next setting (an enqueued one first); answer it with one of the
        ``tell``/``skip``/``duplicate`` calls."""
        trial = self._open = self.study.ask()

        def choose(name: str, choices: tuple[Any, ...]) -> Any:
            return trial.suggest_categorical(name, self._declared(name, choices))

        bs = choose("batch_size", space.batch_sizes)
        workers = trial.suggest_int("num_workers", 0, space.max_workers)
        pf = pers = None
        if workers:
            pf = choose("prefetch_factor", space.prefetch_factors)
            pers = choose("persistent_workers", space.persistent_workers)
        pin = choose("pin_memory", space.pin_memory)
        return Config(int(bs), workers, pf, bool(pin), bool(pers))

    def _declared(self, name: str, choices: tuple[Any, ...]) -> tuple[Any, ...]:
        """The choices of categorical ``name`` as this run first declared them, while
        ``choices`` are among them. A space narrowed mid-search (a batch size no longer the
        loop's to change, a loader found created again) keeps them: Optuna's categorical has no
        dynamic value space (it raises "does not support dynamic value space"), and the driver
        skips a proposal outside the space (:meth:`SearchSpace.rejects`)."""
        first = self._choices.setdefault(name, tuple(choices))
        return first if set(choices) <= set(first) else tuple(choices)

    def _close(self) -> optuna.trial.Trial:
        trial, self._open = self._open, None
        if trial is None:
            raise RuntimeError("no open trial: call ask() first")
        return trial

    @_whole
    def tell(self, result: TrialResult) -> None:
        """Record the measurement of the setting ``ask`` returned."""
        trial = self._close()
        result.number = trial.number
        trial.set_user_attr("phase", result.phase)
        trial.set_user_attr("error", result.error)
        trial.set_user_attr("result", result.to_dict())
        if result.failure is not None:
            self.study.tell(trial, state=TrialState.FAIL)
        elif result.pruned or result.skipped is not None:  # (skipped: cut at the deadline)
            subs = result.measurement.sub_window_samples_per_s if result.measurement else []
            for i, rate in enumerate(subs):
                trial.report(rate, i)
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, result.epoch_samples_per_s)

    @_whole
    def skip(self, reason: str) -> None:
        """The setting ``ask`` returned is not run (``reason``); recorded as pruned."""
        trial = self._close()
        trial.set_user_attr("skipped", reason)
        self.study.tell(trial, state=TrialState.PRUNED)

    @_whole
    def duplicate(self, value: float) -> None:
        """The setting was measured already: its value again (the way Optuna's FAQ suggests)."""
        trial = self._close()
        trial.set_user_attr("duplicate", True)
        self.study.tell(trial, value)

    @_whole
    def save(self) -> str | None:
        """Write a buffered study to its storage (replacing one of that name); None when done
        or nothing to do, else why it could not be written (the search's result stands)."""
        if self._buffer is None:
            return None
        try:
            _replace(self.storage, self.name)
            optuna.copy_study(
                from_study_name=self.name, from_storage=self._buffer, to_storage=self.storage
            )
        except Exception as exc:  # sqlalchemy's errors, a locked or unwritable file
            return f"the study could not be written to {self.storage}: {type(exc).__name__}: {exc}"
        return None

    @_whole
    def abandon(self, reason: str) -> None:
        """Close an open trial as failed (Ctrl-C, the user's bug) so no trial stays RUNNING."""
        if self._open is not None:
            trial = self._close()
            trial.set_user_attr("error", reason)
            self.study.tell(trial, state=TrialState.FAIL)

    def interrupted(self, best: dict[str, Any] | None) -> SearchInterrupted:
        """Ctrl-C: close the open trial; the error says what the study keeps and how to resume."""
        self.abandon("interrupted")
        n = self.n_complete() + self._n_unrecorded(ok=True)
        return SearchInterrupted.kept(
            study_name=self.name, storage=self.storage, n_complete=n, best=best, fresh=self.fresh
        )

    @_whole
    def record(self, space: SearchSpace, result: TrialResult) -> None:
        """Add a trial measured outside ask/tell (probe, confirmation), if it is in the space."""
        if space.rejects(result.config) is not None:
            return
        if result.failure is not None:
            state = TrialState.FAIL
        else:
            stopped = result.pruned or result.skipped is not None  # (cut at the deadline)
            state = TrialState.PRUNED if stopped else TrialState.COMPLETE
        self.study.add_trial(
            optuna.trial.create_trial(
                params=_params(result.config),
                distributions=_distributions(space, result.config, self._declared),
                value=result.epoch_samples_per_s if state == TrialState.COMPLETE else None,
                state=state,
                user_attrs={
                    "phase": result.phase,
                    "error": result.error,
                    "result": result.to_dict(),
                },
            )
        )
        result.number = len(self.study.get_trials(deepcopy=False)) - 1

    def n_complete(self) -> int:
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def replaced_name(name: str, started: str) -> str:
    """The name study ``name`` created at ``started`` keeps once a fresh search replaced it."""
    return f"{name}@{started}"


def _replace(storage: str, name: str) -> None:
    """Make way for a fresh study ``name``: the one there is copied to
    :func:`replaced_name` first (when it has trials and says when it started), then deleted.
    A saved entry names its study by both (``study_started``), and ``loadertune report`` finds
    the copy (:func:`study_of_entry`): a fresh search written to another file had taken the
    study of the first file's entry, and its report mixed the two searches. The newest
    :data:`KEEP_REPLACED` copies of a name are kept."""
    try:
        old = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return
    started = old.user_attrs.get(STARTED)
    names = optuna.get_all_study_names(storage)
    copy = replaced_name(name, started) if isinstance(started, str) else None
    if copy is not None and copy not in names and old.get_trials(deepcopy=False):
        optuna.copy_study(
            from_study_name=name, from_storage=storage, to_storage=storage, to_study_name=copy
        )
        names.append(copy)
    optuna.delete_study(study_name=name, storage=storage)
    copies = sorted(n for n in names if n.startswith(f"{name}@"))  # ISO times sort in order
    for stale in copies[:-KEEP_REPLACED]:
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=stale, storage=storage)


def study_of_entry(storage: str, name: str, started: str | None) -> str:
    """The name of the study a saved entry was written from: ``name``, or the copy a later
    fresh search of that name left (:func:`_replace`) when the study called ``name`` now
    started at another time than the entry's (``started``: its ``study_started``; None, an
    older entry: ``name``)."""
    if not started:
        return name
    with quiet_optuna():
        try:
            current = optuna.load_study(study_name=name, storage=storage)
            if current.user_attrs.get(STARTED) in (None, started):
                return name
            copy = replaced_name(name, started)
            return copy if copy in optuna.get_all_study_names(storage) else name
        except Exception:  # the report's own read says what is wrong
            return name


def stored_trials(storage: str, name: str) -> list[dict[str, Any]]:
    """Every trial of study ``name`` in ``storage`` as plain data, for reports that do not
    import Optuna: ``number``, ``state`` (``"COMPLETE"``, ``"PRUNED"``, ``"FAIL"``...),
    ``params``, ``value``, ``start``/``end`` (datetimes or None) and ``user_attrs`` (the
    search's full ``result`` of each measured trial, its ``phase`` and ``error``).

    Raises:
        ConfigError: the storage cannot be opened, or holds no study of that name.
    """
    with quiet_optuna():
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            known = ", ".join(repr(s) for s in optuna.get_all_study_names(storage)) or "none"
            raise ConfigError(
                f"{storage} has no study {name!r}; it has: {known}. Pass one of those "
                "with --study, or the storage of the search with --storage."
            ) from None
        except Exception as exc:  # sqlalchemy's ArgumentError, OperationalError...
            raise ConfigError(
                f"cannot open the study storage {storage!r} ({type(exc).__name__}: {exc}). "
                "Pass the storage URL of the search with --storage."
            ) from exc
        return [
            {
                "number": t.number,
                "state": t.state.name,
                "params": dict(t.params),
                "value": t.value,
                "start": t.datetime_start,
                "end": t.datetime_complete,
                "user_attrs": dict(t.user_attrs),
            }
            for t in study.get_trials(deepcopy=False)
        ]
