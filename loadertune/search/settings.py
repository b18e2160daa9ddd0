"""How a search spends its budget, and where its study lives."""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loadertune.errors import ConfigError


@dataclass(frozen=True)
class SearchSettings:
    """How a search spends its budget. Every field has a sensible default.

    Attributes:
        budget_s: wall-clock cap of the whole search, confirmation included.
        n_trials: cap on settings measured in the probe and exploration (None: budget only).
        window_s: measured window per trial (None: budget_s / 80, within 0.5..3 s: short
            windows, so that more settings and more confirmation rounds fit; the rounds, not the
            window's length, average out a shared machine's drift. budget_s / 40 on a ``live``
            run, which trains through its trials: fewer, longer ones cost it less). An epoch
            that takes at most two window trials is measured whole instead
            (:func:`loadertune.search.limits.short_epoch_s`).
        startup_timeout_s: how long the first trial may take to reach its first batch (a
            script's imports, dataset and model set-up); later trials get a limit from it.
        max_workers: the user's cap on ``num_workers`` (None: derived from the machine).
        finalists: settings besides the baseline re-measured at the end.
        confirm_rounds: at most this many interleaved rounds of that re-measurement; they go
            on while time is left and more than one setting may still win (a setting clearly
            behind the leader leaves the rounds).
        patience: stop exploring after this many trials without a gain of ``min_gain``.
        min_gain: relative gain that counts as an improvement (below it is noise).
        prune_ratio: stop a trial mid-window when its rate is below this fraction of the best.
        memory_margin: share of GPU memory kept free when predicting the largest batch that fits
            (memory creeps up during real training).
        memory_budget_fraction: share of available RAM a trial's processes may add.
        shm_fraction: share of free ``/dev/shm`` that batches in flight may take.
        seed: seed of the sampler, for repeatable proposals.
        storage: an Optuna storage URL (None: SQLite in the user's cache directory).
        study_name: name of the study in that storage; the same name resumes it (None: the
            API derives one from the workload, so each workload keeps its own study).
        resume: continue an existing study of that name (False: start it afresh).
        ranks: processes that each run the loader side by side (``torchrun --nproc-per-node``):
            the CPUs, the RAM budget and ``/dev/shm`` that bound the workers are divided among
            them.
        live: the trials run on a real training loop (``loadertune run --tune``,
            :func:`~loadertune.tuned`): a trial is pruned against the best so far (every second
            it runs slower costs the training), not against the median of the three best; the
            winner replaces the baseline, the setting running, only when this run's rates say
            so often enough (:func:`loadertune.search.plan.switch_pays`); the study is written
            to its storage once, when the search ends.
    """

    budget_s: float = 60.0
    n_trials: int | None = None
    window_s: float | None = None
    startup_timeout_s: float = 120.0
    max_workers: int | None = None
    finalists: int = 4
    confirm_rounds: int = 12
    patience: int = 8
    min_gain: float = 0.02
    prune_ratio: float = 0.6
    memory_margin: float = 0.10
    memory_budget_fraction: float = 0.8
    shm_fraction: float = 0.5
    seed: int | None = None
    storage: str | None = None
    study_name: str | None = None
    resume: bool = True
    ranks: int = 1
    live: bool = False

    def __post_init__(self) -> None:
        if not (
            isinstance(self.budget_s, (int, float))
            and math.isfinite(self.budget_s)
            and self.budget_s > 0
        ):
            raise ConfigError(
                f"budget_s must be a positive number of seconds, but got {self.budget_s!r}."
            )
        if self.n_trials is not None and (not isinstance(self.n_trials, int) or self.n_trials < 1):
            raise ConfigError(
                f"n_trials must be a positive int or None, but got {self.n_trials!r}."
            )
        if self.window_s is not None and not self.window_s > 0:
            raise ConfigError(f"window_s must be > 0 seconds, but got {self.window_s!r}.")
        if not self.startup_timeout_s > 0:
            raise ConfigError(
                f"startup_timeout_s must be > 0 seconds, but got {self.startup_timeout_s!r}."
            )
        if not 0 < self.memory_budget_fraction <= 1:
            raise ConfigError(
                "memory_budget_fraction must be in (0, 1], but got "
                f"{self.memory_budget_fraction!r}."
            )
        if not 0 <= self.memory_margin < 1:
            raise ConfigError(f"memory_margin must be in [0, 1), but got {self.memory_margin!r}.")
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise ConfigError(f"ranks must be an int >= 1, but got {self.ranks!r}.")
        if self.confirm_rounds < 1 or self.finalists < 1 or self.patience < 1:
            raise ConfigError("confirm_rounds, finalists and patience must be >= 1.")

    @property
    def study(self) -> str:
        """The study's name (``"loadertune"`` when none was given or derived)."""
        return self.study_name or "loadertune"

    @property
    def trial_window_s(self) -> float:
        # A live run trains through its trials: a longer window per setting, fewer settings
        # tried, cost it less.
        share = 40 if self.live else 80
        return self.window_s or min(3.0, max(0.5, self.budget_s / share))


def default_storage() -> str:
    """SQLite in ``$LOADERTUNE_CACHE_DIR`` or the user's cache directory.

    Raises:
        StorageUnavailable: that folder cannot be created (a read-only home, ``XDG_CACHE_HOME``
            naming a file).
    """
    env = os.environ.get("LOADERTUNE_CACHE_DIR")
    if env:
        root = Path(env)
    else:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("loadertune"))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageUnavailable(root, exc) from exc
    return f"sqlite:///{root / 'studies.db'}"


def storage_or_fallback(note: Callable[[str], None] | None) -> str:
    """The default storage, or, where it cannot be had, a study in a temporary folder that no
    later search resumes (removed when this process exits): the search goes on and saves its
    recommendation, and ``note`` says how to choose a storage that lasts."""
    try:
        return default_storage()
    except StorageUnavailable as exc:
        folder = Path(tempfile.mkdtemp(prefix="loadertune-study-"))
        atexit.register(shutil.rmtree, folder, True)  # no later search can resume it
        if note is not None:
            note(
                f"cannot create the study cache {exc.root} ({exc.reason}); this search cannot "
                "be resumed: choose a storage with --storage URL (storage= in code) or point "
                "XDG_CACHE_HOME or LOADERTUNE_CACHE_DIR at a writable folder"
            )
        return f"sqlite:///{folder / 'studies.db'}"


class StorageUnavailable(OSError):
    """The study cache folder cannot be created."""

    def __init__(self, root: Path, exc: OSError) -> None:
        super().__init__(f"cannot create {root}: {exc}")
        self.root = root
        self.reason = f"{type(exc).__name__}: {exc.strerror or exc}"
