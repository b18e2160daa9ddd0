"""The search driver: probe, seed, explore with Optuna, confirm. Only this module imports optuna.

1. **Probe**: the user's own settings (the baseline), ``num_workers=0`` and ``1`` at the user's
   batch size, and a replay of one cached batch through the step. :mod:`loadertune.probe` turns
   them into per-sample costs, ceilings and the settings worth trying first.
2. **Space** from the machine and the probe (:mod:`loadertune.space`).
3. **Explore**: the seeds are enqueued, then Optuna's TPE (multivariate, over the conditional
   space) proposes settings. A trial whose running rate falls clearly below the best so far is
   stopped mid-window (pruned); a setting already measured is not run again; a setting at least
   as demanding as one that ran out of memory, shared memory or file descriptors is not tried.
   Exploration stops at the budget, at ``n_trials``, when nothing has improved for ``patience``
   trials, when the space is exhausted, or when the best sits at the estimated ceiling.
4. **Confirm**: finalists and baseline re-measured side by side (:mod:`loadertune.confirm`).

The study persists in an Optuna storage (SQLite in the user's cache directory by default), so an
interrupted search resumes and its history can be read with Optuna's own tools.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from loadertune import analysis, memory
from loadertune.confirm import Confirmation, confirm
from loadertune.errors import ConfigError, LoadertuneError, SearchInterrupted, UserCodeError
from loadertune.failures import RESOURCE_KINDS
from loadertune.hardware import Hardware
from loadertune.memory import MemoryModel
from loadertune.probe import Estimates, estimate, seed_configs
from loadertune.resources import tree_pss
from loadertune.space import Config, SearchSpace, worker_cap
from loadertune.trial import Limits, TrialResult, TrialRunner, window_for


@dataclass(frozen=True)
class SearchSettings:
    """How a search spends its budget. Every field has a sensible default.

    Attributes:
        budget_s: wall-clock cap of the whole search, confirmation included.
        n_trials: cap on settings measured in the probe and exploration (None: budget only).
        window_s: measured window per trial (None: budget_s / 40, within 0.5..3 s).
        startup_timeout_s: how long the first trial may take to reach its first batch (a
            script's imports, dataset and model set-up); later trials get a limit from it.
        max_workers: the user's cap on ``num_workers`` (None: derived from the machine).
        finalists: settings besides the baseline re-measured at the end.
        confirm_rounds: interleaved rounds of that re-measurement.
        patience: stop exploring after this many trials without a gain of ``min_gain``.
        min_gain: relative gain that counts as an improvement (below it is noise).
        prune_ratio: stop a trial mid-window when its rate is below this fraction of the best.
        memory_margin: share of GPU memory kept free when predicting the largest batch that fits
            (memory creeps up during real training).
        memory_budget_fraction: share of available RAM a trial's processes may add.
        shm_fraction: share of free ``/dev/shm`` that batches in flight may take.
        seed: seed of the sampler, for repeatable proposals.
        storage: an Optuna storage URL (None: SQLite in the user's cache directory).
        study_name: name of the study in that storage; the same name resumes it.
        resume: continue an existing study of that name (False: start it afresh).
    """

    budget_s: float = 60.0
    n_trials: int | None = None
    window_s: float | None = None
    startup_timeout_s: float = 120.0
    max_workers: int | None = None
    finalists: int = 2
    confirm_rounds: int = 3
    patience: int = 8
    min_gain: float = 0.02
    prune_ratio: float = 0.6
    memory_margin: float = 0.10
    memory_budget_fraction: float = 0.8
    shm_fraction: float = 0.5
    seed: int | None = None
    storage: str | None = None
    study_name: str = "loadertune"
    resume: bool = True

    def __post_init__(self) -> None:
        if not (
            isinstance(self.budget_s, (int, float))
            and math.isfinite(self.budget_s)
            and self.budget_s > 0
        ):
            raise ConfigError(
                f"budget_s must be a positive number of seconds, but got {self.budget_s=}."
            )
        if self.n_trials is not None and (not isinstance(self.n_trials, int) or self.n_trials < 1):
            raise ConfigError(f"n_trials must be a positive int or None, but got {self.n_trials=}.")
        if self.window_s is not None and not self.window_s > 0:
            raise ConfigError(f"window_s must be > 0 seconds, but got {self.window_s=}.")
        if not self.startup_timeout_s > 0:
            raise ConfigError(
                f"startup_timeout_s must be > 0 seconds, but got {self.startup_timeout_s=}."
            )
        if not 0 < self.memory_budget_fraction <= 1:
            raise ConfigError(
                f"memory_budget_fraction must be in (0, 1], but got {self.memory_budget_fraction=}."
            )
        if not 0 <= self.memory_margin < 1:
            raise ConfigError(f"memory_margin must be in [0, 1), but got {self.memory_margin=}.")
        if self.confirm_rounds < 1 or self.finalists < 1 or self.patience < 1:
            raise ConfigError("confirm_rounds, finalists and patience must be >= 1.")

    @property
    def trial_window_s(self) -> float:
        return self.window_s or min(3.0, max(0.5, self.budget_s / 40))


def default_storage() -> str:
    """SQLite in ``$LOADERTUNE_CACHE_DIR`` or the user's cache directory."""
    env = os.environ.get("LOADERTUNE_CACHE_DIR")
    if env:
        root = Path(env)
    else:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("loadertune"))
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'studies.db'}"


class Observer(Protocol):
    """Hears the search as it goes (the live view in :mod:`loadertune.report`)."""

    def search_started(self, deadline: float, budget_s: float) -> None: ...
    def phase(self, name: str) -> None: ...
    def trial_started(self, config: Config | None, phase: str) -> None: ...
    def trial_finished(self, result: TrialResult, best: TrialResult | None) -> None: ...


@dataclass
class SearchOutcome:
    """Everything a search found; :mod:`loadertune.api` turns it into a Recommendation."""

    baseline: Config
    winner: Config
    trials: list[TrialResult]
    confirmation: Confirmation | None
    estimates: Estimates | None
    space: SearchSpace
    stop_reason: str
    study_name: str
    storage: str
    elapsed_s: float
    n_previous_trials: int
    user_batch_size: int
    values: dict[Config, float] = field(default_factory=dict)  # best search value per setting
    memory_margin: float = 0.10

    def results_for(self, config: Config) -> list[TrialResult]:
        """The measurements that speak for ``config``: its confirmation rounds, else its trials."""
        if self.confirmation is not None and self.confirmation.results.get(config):
            return self.confirmation.results[config]
        return [t for t in self.trials if t.config == config and t.phase != "replay"]

    def value(self, config: Config) -> float | None:
        """The confirmed median when there is one, else the search's figure."""
        if self.confirmation is not None and self.confirmation.median(config) is not None:
            return self.confirmation.median(config)
        return self.values.get(config)

    def best_at_batch_size(self, batch_size: int) -> Config | None:
        candidates = [
            c
            for c in {*self.values, *(self.confirmation.values if self.confirmation else {})}
            if c.batch_size == batch_size and self.value(c) is not None
        ]
        return max(candidates, key=lambda c: self.value(c) or 0.0) if candidates else None


def dominated(config: Config, failed: Config, kind: str) -> bool:
    """Would ``config`` fail like ``failed`` did? True when it asks for at least as much of
    the resource that ran out."""
    if kind == "pickle_error":
        return config.num_workers > 0
    if kind == "oom":  # GPU memory grows with the batch, not the workers
        return config.batch_size >= failed.batch_size and config.pin_memory == failed.pin_memory
    if kind not in RESOURCE_KINDS or failed.num_workers == 0:
        return False
    return (
        config.num_workers >= failed.num_workers
        and config.batch_size >= failed.batch_size
        and config.in_flight_batches >= failed.in_flight_batches
    )


def _distributions(space: SearchSpace, config: Config) -> dict[str, BaseDistribution]:
    dists: dict[str, BaseDistribution] = {
        "batch_size": CategoricalDistribution(space.batch_sizes),
        "num_workers": IntDistribution(0, space.max_workers),
        "pin_memory": CategoricalDistribution(space.pin_memory),
    }
    if config.num_workers:
        dists["prefetch_factor"] = CategoricalDistribution(space.prefetch_factors)
        dists["persistent_workers"] = CategoricalDistribution(space.persistent_workers)
    return dists


def _params(config: Config) -> dict[str, Any]:
    return {
        k: v
        for k, v in config.loader_kwargs().items()
        if not (k == "persistent_workers" and not config.num_workers)
    }


@contextlib.contextmanager
def _quiet_optuna() -> Iterator[None]:
    """Optuna logs every trial at INFO; keep the terminal for our own view, and restore after."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(before)


class Search:
    """One search over one workload. See the module docstring.

    Args:
        runner: runs trials of the workload.
        hardware: this machine.
        baseline: the user's own settings (measured first, and re-measured at the end); None
            when only the first trial can tell them (a script's own loader).
        batch_sizes: the batch sizes to consider (the baseline's is added; empty: only it).
        settings: budget and policy.
        observer: hears progress (None: silent).
    """

    def __init__(
        self,
        runner: TrialRunner,
        *,
        hardware: Hardware,
        baseline: Config | None,
        batch_sizes: Sequence[int],
        settings: SearchSettings,
        observer: Observer | None = None,
    ) -> None:
        self.runner = runner
        self.hw = hardware
        self._baseline = baseline
        self._batch_sizes = tuple(batch_sizes)
        self.settings = settings
        self.observer = observer
        self.storage = settings.storage or default_storage()
        self.trials: list[TrialResult] = []
        self.values: dict[Config, float] = {}
        self.failed: list[tuple[Config, str]] = []
        self.best: TrialResult | None = None
        self._best_value = 0.0
        self._since_gain = 0
        self._n_run = 0
        self._deadline = 0.0
        self._memory_budget: int | None = None
        self._open: optuna.trial.Trial | None = None

    @property
    def baseline(self) -> Config:
        if self._baseline is None:
            raise RuntimeError("the baseline is known after the first trial")
        return self._baseline

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({*self._batch_sizes, self.baseline.batch_size}))

    # -- bookkeeping -----------------------------------------------------------------------------

    def _remaining(self) -> float:
        return self._deadline - time.monotonic()

    def _typical_wall(self) -> float:
        walls = [t.wall_s for t in self.trials if t.ok and t.phase != "replay"]
        return statistics.median(walls) if walls else self.settings.trial_window_s + 1.0

    def _limits(self) -> Limits:
        ok = [t for t in self.trials if t.ok and t.measurement and t.measurement.n_batches]
        if ok:
            per_batch = max(
                t.measurement.window_s / t.measurement.n_batches for t in ok if t.measurement
            )
            startup = max(t.wall_s for t in ok)
            hang = max(5.0, 20 * per_batch)
            start = min(self.settings.startup_timeout_s, max(15.0, 4 * startup))
        else:  # nothing known yet: scripts import, CUDA initialises
            hang, start = 15.0, self.settings.startup_timeout_s
        timeout = max(2.0, min(4 * self._typical_wall() + start, self._remaining() + 1.0))
        return Limits(
            timeout_s=timeout,
            startup_s=min(start, timeout),
            hang_s=hang,
            memory_budget_bytes=self._memory_budget,
        )

    def _prune_rule(self, index: int, running: float) -> bool:
        return (
            index >= 1
            and self.best is not None
            and running < self.settings.prune_ratio * self._best_value
        )

    def _measure(self, config: Config | None, phase: str, *, prunable: bool = False) -> TrialResult:
        """Run one trial (``config=None``: the workload's own settings) and learn from it."""
        if self.observer:
            self.observer.trial_started(config, phase)
        window = window_for(config or Config(1), window_s=self.settings.trial_window_s)
        result = self.runner.run(
            config,
            window=window,
            limits=self._limits(),
            phase=phase,
            should_stop=self._prune_rule if prunable else None,
        )
        self.trials.append(result)
        if phase != "replay":
            self._n_run += phase != "confirm"
            self._learn(result)
        if self.observer:
            self.observer.trial_finished(result, self.best)
        if result.failure is not None and result.failure.user_bug:
            raise self.runner.user_error(
                result.failure.message, kind=result.failure.kind, detail=result.failure.detail
            )
        return result

    def _learn(self, result: TrialResult) -> None:
        if result.failure is not None:
            self.failed.append((result.config, result.failure.kind))
            self._since_gain += 1
            return
        value = result.epoch_samples_per_s
        if value is None or result.pruned or result.phase == "confirm":
            self._since_gain += result.phase != "confirm"
            return
        self.values[result.config] = max(value, self.values.get(result.config, 0.0))
        if value > self._best_value * (1 + self.settings.min_gain):
            self._since_gain = 0
        else:
            self._since_gain += 1
        if value > self._best_value:
            self.best, self._best_value = result, value

    # -- the study -------------------------------------------------------------------------------

    def _open_study(self) -> optuna.Study:
        sampler = optuna.samplers.TPESampler(
            multivariate=True,
            group=True,
            seed=self.settings.seed,
            n_startup_trials=5,
            constant_liar=False,
        )
        name = self.settings.study_name
        try:
            if not self.settings.resume:
                with contextlib.suppress(KeyError):
                    optuna.delete_study(study_name=name, storage=self.storage)
            return optuna.create_study(
                storage=self.storage,
                study_name=name,
                sampler=sampler,
                direction="maximize",
                load_if_exists=True,
            )
        except ValueError as exc:  # a study of that name optimises something else
            raise ConfigError(
                f"study {name!r} in {self.storage} is not a loadertune study: {exc}"
            ) from exc
        except Exception as exc:  # sqlalchemy's ArgumentError, NoSuchModuleError, OperationalError
            raise ConfigError(
                f"storage={self.storage!r} is not a storage Optuna can open ({type(exc).__name__}: "
                f"{exc}). Pass a URL such as sqlite:///path/to/studies.db, or leave it out."
            ) from exc

    def _record(self, study: optuna.Study, space: SearchSpace, result: TrialResult) -> None:
        """Add a trial that ran outside ask/tell (probe, confirmation) to the study."""
        if space.rejects(result.config) is not None:
            return
        attrs = {"phase": result.phase, "error": result.error, "result": result.to_dict()}
        value = result.epoch_samples_per_s
        state = (
            TrialState.FAIL
            if result.failure
            else (TrialState.PRUNED if result.pruned else TrialState.COMPLETE)
        )
        frozen = optuna.trial.create_trial(
            params=_params(result.config),
            distributions=_distributions(space, result.config),
            value=value if state == TrialState.COMPLETE else None,
            state=state,
            user_attrs=attrs,
        )
        study.add_trial(frozen)
        result.number = study.trials[-1].number if study.trials else None

    def _tell(self, study: optuna.Study, trial: optuna.trial.Trial, result: TrialResult) -> None:
        result.number = trial.number
        trial.set_user_attr("phase", result.phase)
        trial.set_user_attr("error", result.error)
        trial.set_user_attr("result", result.to_dict())
        self._open = None
        if result.failure is not None:
            study.tell(trial, state=TrialState.FAIL)
        elif result.pruned:
            for i, rate in enumerate(
                result.measurement.sub_window_samples_per_s if result.measurement else []
            ):
                trial.report(rate, i)
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, result.epoch_samples_per_s)

    def _load_previous(self, study: optuna.Study) -> tuple[SearchSpace, Estimates] | None:
        """Space, estimates and results of an earlier run of this study (None if fresh)."""
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)  # a crashed run's
        attrs = study.user_attrs
        if "space" not in attrs or "estimates" not in attrs:
            return None
        space_d = dict(attrs["space"])
        for key in ("batch_sizes", "prefetch_factors", "pin_memory", "persistent_workers"):
            space_d[key] = tuple(space_d[key])
        space = SearchSpace(**space_d)
        est_fields = {f.name for f in dataclasses.fields(Estimates)}
        est = Estimates(**{k: v for k, v in attrs["estimates"].items() if k in est_fields})
        for t in study.get_trials(deepcopy=False):
            try:
                config = Config.from_kwargs(t.params)
            except (ConfigError, KeyError):
                continue
            if t.state == TrialState.COMPLETE and t.value is not None:
                self.values[config] = max(t.value, self.values.get(config, 0.0))
                if t.value > self._best_value:
                    self._best_value = t.value
            elif t.state == TrialState.FAIL and t.user_attrs.get("error"):
                self.failed.append((config, t.user_attrs["error"]))
        return space, est

    # -- phases ----------------------------------------------------------------------------------

    def _measure_baseline(self) -> TrialResult:
        """Measure the user's settings; a script's are learnt from this first trial."""
        base = self._measure(self._baseline, "baseline")
        if self._baseline is None:
            if "loader" not in base.extra:
                why = base.failure.message if base.failure else "it reported no loader"
                raise LoadertuneError(f"could not measure the workload's own settings: {why}")
            self._baseline = base.config
        return base

    def _probe(self) -> tuple[TrialResult, TrialResult | None, TrialResult]:
        """Baseline, num_workers=0 and 1 at the user's batch size, and the replay."""
        base = self._measure_baseline()
        bs = self.baseline.batch_size
        w0 = base if self.baseline == Config(bs) else None
        if w0 is None:
            w0 = self._measure(Config(bs), "probe")
        w1 = None
        cap = self.settings.max_workers
        if cap is None or cap >= 1:
            one = Config(bs, 1, 2, False, False)
            w1 = base if self.baseline == one else self._measure(one, "probe")
        replay = self._measure(Config(bs), "replay")
        if not (w0.ok and replay.ok):
            why = w0.failure or replay.failure
            raise LoadertuneError(
                f"the probe could not measure the workload with num_workers=0: "
                f"{why.message if why else 'no result'}; {why.advice if why else ''}"
            )
        return w0, (w1 if w1 is not None and w1.ok else None), replay

    def _build_space(
        self, w0: TrialResult, w1: TrialResult | None
    ) -> tuple[SearchSpace, dict[str, int]]:
        m0 = w0.measurement
        io_bound = m0 is not None and (m0.blocked_cpu_fraction or 1.0) < 0.5
        worker_pss = w1.resources.worker_pss_bytes if w1 and w1.resources else None
        cap, limits = worker_cap(
            usable_cpus=self.hw.usable_cpus,
            io_bound=io_bound,
            ram_budget_bytes=self._memory_budget,
            main_pss_bytes=None,
            worker_pss_bytes=worker_pss,
            user_max=self.settings.max_workers,
        )
        in_flight_budget = None
        if self.hw.shm_free_bytes:
            in_flight_budget = self.settings.shm_fraction * self.hw.shm_free_bytes
        space = SearchSpace(
            batch_sizes=self.batch_sizes,
            max_workers=cap,
            pin_memory=(False, True) if self.runner.uses_cuda else (False,),
            persistent_workers=(False, True)
            if self.runner.epoch_samples
            else (self.baseline.persistent_workers,),
            max_in_flight_bytes=in_flight_budget,
            bytes_per_sample=self.runner.bytes_per_sample,
            limits=limits,
        )
        return space, limits

    def _stop_reason(
        self, space_size: int, n_batch_sizes: int, est: Estimates | None, reserve_s: float
    ) -> str | None:
        s = self.settings
        if self._remaining() - reserve_s < self._typical_wall():
            return "budget"
        if s.n_trials is not None and self._n_run >= s.n_trials:
            return "n_trials"
        if self._since_gain >= s.patience:
            return "no_improvement"
        if len(self.values) + len(self.failed) >= space_size:
            return "space_exhausted"
        if est is not None and n_batch_sizes == 1 and self._best_value >= 0.97 * est.achievable:
            return "at_ceiling"
        return None

    def _suggest(self, trial: optuna.trial.Trial, space: SearchSpace) -> Config:
        bs = trial.suggest_categorical("batch_size", space.batch_sizes)
        workers = trial.suggest_int("num_workers", 0, space.max_workers)
        pf = pers = None
        if workers:
            pf = trial.suggest_categorical("prefetch_factor", space.prefetch_factors)
            pers = trial.suggest_categorical("persistent_workers", space.persistent_workers)
        pin = trial.suggest_categorical("pin_memory", space.pin_memory)
        return Config(int(bs), workers, pf, bool(pin), bool(pers))

    def _explore(self, study: optuna.Study, space: SearchSpace, est: Estimates | None) -> str:
        reserve = self._confirm_cost()
        space_size = len(space.configs())
        idle = 0  # consecutive proposals that ran nothing (duplicates, skips)
        verified = False
        while True:
            if not verified and self._memory_model()[0] is not None:
                self._verify_largest_batch(study, space)
                verified = True
            reason = self._stop_reason(space_size, len(space.batch_sizes), est, reserve)
            if reason:
                return reason
            if idle >= 50:
                return "no_new_proposals"
            trial = self._open = study.ask()
            config = self._suggest(trial, space)
            skip = (
                space.rejects(config)
                or next(
                    (
                        f"at least as demanding as {f.label()}, which failed ({kind})"
                        for f, kind in self.failed
                        if dominated(config, f, kind)
                    ),
                    None,
                )
                or self._memory_skip(config)
            )
            if skip is not None:
                trial.set_user_attr("skipped", skip)
                study.tell(trial, state=TrialState.PRUNED)
                self._open = None
                idle += 1
                continue
            if config in self.values:  # measured already: Optuna's FAQ way, reuse the value
                trial.set_user_attr("duplicate", True)
                study.tell(trial, self.values[config])
                self._open = None
                self._since_gain += 1
                idle += 1
                continue
            idle = 0
            self._tell(study, trial, self._measure(config, "search", prunable=True))

    def _confirm_cost(self) -> float:
        """Seconds to keep for the confirmation: its rounds, or at most 40% of the budget."""
        n = 1 + self.settings.finalists + (len(self.batch_sizes) > 1)  # + best at the user's bs
        rounds = max(2, self.settings.confirm_rounds)
        return min(0.4 * self.settings.budget_s, n * rounds * self._typical_wall())

    # -- GPU memory ------------------------------------------------------------------------------

    def _oom_batch_sizes(self) -> list[int]:
        return [c.batch_size for c, kind in self.failed if kind == "oom"]

    def _memory_model(self) -> tuple[MemoryModel | None, int | None]:
        """The fitted peak-memory line and this process's GPU capacity (Nones without CUDA)."""
        points = [
            (t.config.batch_size, t.cuda_peak_reserved_bytes)
            for t in self.trials
            if t.ok and t.cuda_peak_reserved_bytes
        ]
        capacities = [t.cuda_capacity_bytes for t in self.trials if t.cuda_capacity_bytes]
        return memory.fit(points), (min(capacities) if capacities else None)

    def _memory_skip(self, config: Config) -> str | None:
        """Why ``config``'s batch is predicted not to fit in GPU memory, or None."""
        measured_ok = [c.batch_size for c in self.values]
        if measured_ok and config.batch_size <= max(measured_ok):
            return None  # a batch this large already ran
        model, capacity = self._memory_model()
        if model is None or capacity is None:
            return None
        limit = model.max_batch_size(capacity, margin=self.settings.memory_margin)
        if limit is None or config.batch_size <= limit:
            return None
        return (
            f"batch_size {config.batch_size} is predicted to need "
            f"{model.predict(config.batch_size) / memory.MIB:,.0f} MiB of GPU memory; "
            f"{(1 - self.settings.memory_margin) * capacity / memory.MIB:,.0f} MiB may be used"
        )

    def _verify_largest_batch(self, study: optuna.Study, space: SearchSpace) -> None:
        """Enqueue one trial at the largest batch the model says fits, with the best settings."""
        model, capacity = self._memory_model()
        if model is None or capacity is None or self.best is None or len(space.batch_sizes) < 2:
            return
        size = memory.largest_safe_batch(
            model,
            capacity,
            candidates=list(space.batch_sizes),
            oom_at=self._oom_batch_sizes(),
            margin=self.settings.memory_margin,
        )
        if size is None or any(c.batch_size == size for c in self.values):
            return
        study.enqueue_trial(
            _params(dataclasses.replace(self.best.config, batch_size=size)), skip_if_exists=True
        )

    def _finalists(self) -> list[Config]:
        oom = self._oom_batch_sizes()
        ranked = sorted(
            (c for c in self.values if not oom or c.batch_size < min(oom)),
            key=lambda c: self.values[c],
            reverse=True,
        )
        if not ranked:
            return []
        top = [c for c in ranked if self.values[c] >= 0.85 * self.values[ranked[0]]][
            : self.settings.finalists
        ]
        at_user_bs = [c for c in ranked if c.batch_size == self.baseline.batch_size][:1]
        return list(dict.fromkeys([*top, *at_user_bs]))

    def _confirm(
        self, study: optuna.Study, space: SearchSpace, *, baseline_only: bool = False
    ) -> Confirmation | None:
        finalists = [] if baseline_only else self._finalists()
        configs = list(dict.fromkeys([*finalists, self.baseline]))
        wall = self._typical_wall()
        rounds = min(
            self.settings.confirm_rounds, int(self._remaining() // max(wall * len(configs), 1e-9))
        )
        if rounds < 1:
            return None

        def run(config: Config) -> TrialResult:
            result = self._measure(config, "confirm")
            self._record(study, space, result)
            return result

        return confirm(
            run, finalists, self.baseline, rounds=rounds, deadline=self._deadline, trial_wall_s=wall
        )

    # -- the whole search --------------------------------------------------------------------------

    def run(self) -> SearchOutcome:
        t0 = time.monotonic()
        self._deadline = t0 + self.settings.budget_s
        # In-process trials share this process, whose memory is the user's: the budget is on top.
        own = tree_pss(os.getpid()) if self.runner.in_process else 0
        self._memory_budget = own + int(
            self.settings.memory_budget_fraction * self.hw.ram_budget_bytes
        )
        if self.observer:
            self.observer.search_started(self._deadline, self.settings.budget_s)
        with _quiet_optuna():
            study = self._open_study()
            try:
                return self._run(study, t0)
            except KeyboardInterrupt as exc:
                if self._open is not None:
                    self._open.set_user_attr("error", "interrupted")
                    study.tell(self._open, state=TrialState.FAIL)
                n = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
                best = None
                if self.best is not None:
                    best = {
                        "loader_kwargs": self.best.params,
                        "samples_per_s": self.best.samples_per_s,
                        "epoch_samples_per_s": self.best.epoch_samples_per_s,
                    }
                raise SearchInterrupted(
                    f"search interrupted; {n} completed trials are kept in study "
                    f"{self.settings.study_name!r} ({self.storage}); "
                    "run the same command again to resume",
                    study_name=self.settings.study_name,
                    storage=self.storage,
                    n_complete=n,
                    best=best,
                ) from exc
            except UserCodeError:
                if self._open is not None:
                    study.tell(self._open, state=TrialState.FAIL)
                raise

    def _run(self, study: optuna.Study, t0: float) -> SearchOutcome:
        previous = self._load_previous(study)
        n_previous = len(study.trials)
        est: Estimates | None
        if previous is None:
            if self.observer:
                self.observer.phase("probe")
            w0, w1, replay = self._probe()
            space, _ = self._build_space(w0, w1)
            est = estimate(
                w0=w0,
                w1=w1,
                replay=replay,
                usable_cpus=self.hw.usable_cpus,
                max_workers=space.max_workers,
                pinned=True in space.pin_memory,
            )
            study.set_user_attr("space", {**dataclasses.asdict(space)})
            study.set_user_attr("estimates", est.to_dict())
            study.set_user_attr("baseline", self.baseline.loader_kwargs())
            for result in self.trials:
                if result.phase in ("baseline", "probe"):
                    self._record(study, space, result)
        else:
            space, est = previous
            if self._baseline is None:
                self._measure_baseline()
            space = dataclasses.replace(
                space, batch_sizes=tuple(sorted({*space.batch_sizes, *self.batch_sizes}))
            )
        base = next((t for t in self.trials if t.phase == "baseline"), None)
        if len(space.batch_sizes) == 1 and analysis.loader_keeps_up(base, est):
            reason = "compute_bound"  # nothing to gain: confirm the baseline and stop
        else:
            if self.observer:
                self.observer.phase("explore")
            for seed in (
                seed_configs(
                    est,
                    space,
                    batch_size=self.baseline.batch_size,
                    epoch_length_known=bool(self.runner.epoch_samples),
                )
                if est
                else []
            ):
                if seed not in self.values:
                    study.enqueue_trial(_params(seed), skip_if_exists=True)
            reason = self._explore(study, space, est)
        if self.observer:
            self.observer.phase("confirm")
        confirmation = self._confirm(study, space, baseline_only=reason == "compute_bound")
        winner = (confirmation.winner if confirmation and confirmation.winner else None) or (
            max(self.values, key=lambda c: self.values[c]) if self.values else None
        )
        if winner is None:
            causes = sorted({kind for _, kind in self.failed})
            raise LoadertuneError(
                f"every trial failed ({', '.join(causes) or 'no result'}); "
                "see the trial table for each cause and its fix"
            )
        return SearchOutcome(
            baseline=self.baseline,
            winner=winner,
            trials=self.trials,
            confirmation=confirmation,
            estimates=est,
            space=space,
            stop_reason=reason,
            study_name=self.settings.study_name,
            storage=self.storage,
            elapsed_s=time.monotonic() - t0,
            n_previous_trials=n_previous,
            user_batch_size=self.baseline.batch_size,
            values=dict(self.values),
            memory_margin=self.settings.memory_margin,
        )
