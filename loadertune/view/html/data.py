"""What the report draws, read from a recommendation file's entry and, where it can be opened,
the entry's Optuna study.

The file keeps every trial's setting, rate, phase, failure and cost, and the winner's and the
baseline's figures; the study keeps the rest of each measurement (the sub-window rates behind the
spread, the blocked fraction, CPU, PSS, GPU samples, when it ended). A trial of the file is
matched to the study's by its number and setting; what the study cannot give is left out of the
plots, and the report says so.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from loadertune import hardware
from loadertune.config import Config, kwargs_label
from loadertune.errors import ConfigError, LoadertuneError, RecommendationFileError
from loadertune.results import store
from loadertune.search.study import stored_trials, study_of_entry
from loadertune.units import MIB

# The ceilings of the diagnosis, under the names a user knows (see README, "The diagnosis").
CEILING_NAMES = {
    "consumer_samples_per_s": "your step (a cached batch replayed)",
    "cpu_samples_per_s": "the CPUs (loading and your step share them)",
    "loader_samples_per_s": "the loader (every worker busy)",
    "transfer_samples_per_s": "the host-to-device copy",
}
MEASURED_PHASES = ("baseline", "probe", "search", "confirm")  # replay skips loading


@dataclass
class Trial:
    """One trial of the entry, with what the study adds to it (None where it has nothing)."""

    index: int  # 1-based, in the order the search ran them
    phase: str
    config: Config
    status: str  # ok, pruned, failed, skipped
    samples_per_s: float | None
    epoch_samples_per_s: float | None
    wall_s: float
    error: str | None = None
    failure_message: str | None = None
    failure_advice: str | None = None
    end_s: float = 0.0  # when it ended: the cost of the trials up to it, this one's included
    blocked_fraction: float | None = None
    sub_window_samples_per_s: list[float] = field(default_factory=list)
    pss_bytes: float | None = None
    cpu_percent_main: float | None = None
    cpu_percent_workers: float | None = None
    gpu_util_percent: list[int] = field(default_factory=list)
    sampler_decides: bool = False  # the loader's batch sampler makes the batches, not batch_size

    @property
    def measured(self) -> bool:
        """A rate of the loader under this setting (the replay measures the step alone)."""
        return self.phase in MEASURED_PHASES and self.samples_per_s is not None

    @property
    def rate(self) -> float:
        """``samples_per_s``, 0 when it measured none."""
        return self.samples_per_s or 0.0

    @property
    def label(self) -> str:
        return _label(self.config, self.sampler_decides)


@dataclass
class ReportData:
    """Everything the HTML page and the PNG images show."""

    file: str
    machine: str
    workload: str
    entry: dict[str, Any]
    trials: list[Trial]
    study_note: str  # where the details came from, or why they are missing
    time_axis: str  # what Trial.end_s counts

    @property
    def diagnosis(self) -> dict[str, Any]:
        return self.entry.get("diagnosis") or {}

    @property
    def winner(self) -> Config | None:
        return _config(self.entry.get("loader_kwargs"))

    @property
    def baseline(self) -> Config | None:
        return _config((self.entry.get("baseline") or {}).get("loader_kwargs"))

    @property
    def measured(self) -> list[Trial]:
        return [t for t in self.trials if t.measured]

    @property
    def failed(self) -> list[Trial]:
        return [t for t in self.trials if t.status == "failed"]

    def ceilings(self) -> list[tuple[str, float]]:
        """The diagnosis' ceilings worth drawing: name, samples/s; lowest first."""
        found = self.diagnosis.get("ceilings") or {}
        out = [
            (name, float(found[key]))
            for key, name in CEILING_NAMES.items()
            if isinstance(found.get(key), int | float) and found[key] > 0
        ]
        return sorted(out, key=lambda item: item[1])

    def ceilings_near(self) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """The ceilings split into those worth drawing beside the measurements (up to twice the
        highest rate measured) and those far above, which would flatten them."""
        top = 2 * max((t.rate for t in self.measured), default=0.0)
        found = self.ceilings()
        return [c for c in found if c[1] <= top], [c for c in found if c[1] > top]

    def batch_sizes(self) -> list[int]:
        return sorted({t.config.batch_size for t in self.measured})

    @property
    def sampler_decides(self) -> bool:
        """The loader's batch sampler makes its batches: its trials' batch size (1) says
        nothing."""
        return bool((self.entry.get("workload") or {}).get("batch_size_fixed"))

    def label(self, config: Config) -> str:
        """``config``'s label (``bs=sampler`` where the batch sampler decides)."""
        return _label(config, self.sampler_decides)

    def batch_name(self, batch_size: int) -> str:
        """A plot's name for the trials of ``batch_size``."""
        return "the batch sampler's batches" if self.sampler_decides else f"batch {batch_size}"

    def rounds(self, which: str) -> list[float]:
        """Every rate measured of the winner or the baseline (``which``) in the final rounds."""
        figures = self.entry.get(which) or {}
        return [float(r) for r in figures.get("rounds_samples_per_s") or [] if r is not None]


def _label(config: Config, sampler_decides: bool) -> str:
    if sampler_decides:
        return kwargs_label({**config.loader_kwargs(), "batch_size": None})
    return config.label()


def _config(kwargs: object) -> Config | None:
    """The setting of a trial's ``params`` or an entry's ``loader_kwargs`` (those of a loader
    whose batch sampler decides have no batch size: 1, as its trials record)."""
    if not isinstance(kwargs, dict) or "num_workers" not in kwargs:
        return None
    try:
        return Config.from_kwargs(kwargs, batch_size=kwargs.get("batch_size", 1))
    except (ConfigError, TypeError, ValueError):
        return None


def pick_entry(
    path: str, *, machine: str | None = None, workload: str | None = None
) -> tuple[str, str, dict[str, Any]]:
    """The entry to report on: ``machine`` (default: this one, else the file's only machine)
    and ``workload`` (default: the machine's only workload). Returns machine, workload, entry.

    Raises:
        NoRecommendationError, RecommendationFileError: the file has no such entry (the
            message lists the ones it has), or it is damaged.
    """
    machines = store.read(path)["machines"]
    if machine is None:
        here = hardware.current_key()
        machine = here if here in machines or len(machines) != 1 else next(iter(machines))
    if workload is None:
        workloads = store.entries_for(path, machine)
        if len(workloads) != 1:
            store.entry_for(path, machine)  # raises, listing them
        (workload,) = workloads
    entry = store.entry_for(path, machine, workload)
    if not isinstance(entry.get("trials"), list) or not entry["trials"]:
        raise RecommendationFileError(
            f"{path}: the entry for {machine} ({workload}) lists no trials, so there is "
            "nothing to plot. Run `loadertune search` again to record them."
        )
    return machine, workload, entry


def _trial(index: int, raw: dict[str, Any]) -> Trial | None:
    config = _config(raw.get("params"))
    if config is None:
        return None
    failure = raw.get("failure") or {}
    return Trial(
        index=index,
        phase=str(raw.get("phase") or "?"),
        config=config,
        status=str(raw.get("status") or ("failed" if raw.get("error") else "ok")),
        samples_per_s=raw.get("samples_per_s"),
        epoch_samples_per_s=raw.get("epoch_samples_per_s"),
        wall_s=float(raw.get("wall_s") or 0.0),
        error=raw.get("error"),
        failure_message=failure.get("message"),
        failure_advice=failure.get("advice"),
    )


def _enrich(trial: Trial, result: dict[str, Any]) -> None:
    """Add what the study kept of a trial's measurement and resources."""
    m = result.get("measurement") or {}
    trial.blocked_fraction = m.get("blocked_fraction")
    trial.sub_window_samples_per_s = [float(r) for r in m.get("sub_window_samples_per_s") or []]
    res = result.get("resources") or {}
    trial.pss_bytes = res.get("pss_bytes")
    trial.cpu_percent_main = res.get("cpu_percent_main")
    trial.cpu_percent_workers = res.get("cpu_percent_workers")
    trial.gpu_util_percent = [int(p) for p in res.get("gpu_util_percent") or []]


def _from_study(
    trials: list[Trial], raw: list[dict[str, Any]], stored: list[dict[str, Any]]
) -> str:
    """Match the file's trials to the study's by number and setting and add the study's
    details; returns how many matched, and which did not."""
    by_number = {s["number"]: s for s in stored}
    missing: list[str] = []
    for trial, r in zip(trials, raw, strict=True):
        s = by_number.get(r.get("number"))
        result = (s or {}).get("user_attrs", {}).get("result")
        if s is None or not isinstance(result, dict) or result.get("params") != r.get("params"):
            missing.append(f"#{trial.index} {trial.phase}")
            continue
        _enrich(trial, result)
    said = f"details of {len(trials) - len(missing)} of {len(trials)} trials"
    return said + (f" (none for {', '.join(missing)})" if missing else "")


def load(
    path: str,
    *,
    machine: str | None = None,
    workload: str | None = None,
    study: str | None = None,
    storage: str | None = None,
) -> ReportData:
    """Read the entry at ``path`` (see :func:`pick_entry`) and its study (``study`` and
    ``storage`` default to the ones the entry names). A study that cannot be opened leaves the
    report with the file's figures and a note saying why; a ``study`` named explicitly that
    cannot be opened is an error.

    Raises:
        LoadertuneError: the file or the entry cannot be used, or the named study cannot be read.
    """
    machine, workload, entry = pick_entry(path, machine=machine, workload=workload)
    raw = [r for r in entry["trials"] if isinstance(r, dict) and _config(r.get("params"))]
    trials = [t for i, r in enumerate(raw, 1) if (t := _trial(i, r)) is not None]
    fixed = bool((entry.get("workload") or {}).get("batch_size_fixed"))
    for t in trials:
        t.sampler_decides = fixed  # (its batch size, 1, says nothing)
    search = entry.get("search") or {}
    name, url = study or search.get("study_name"), storage or search.get("storage")
    note = "the study is not named in the entry: figures from the file only"
    if name and url and study is None:  # the entry's own: kept under another name once replaced
        name = study_of_entry(url, name, search.get("study_started"))
    if name and url:
        try:
            stored = stored_trials(url, name)
        except LoadertuneError as exc:
            if study is not None or storage is not None:
                raise
            note = f"the study could not be read ({exc}): figures from the file only"
        else:
            note = f"study {name!r} in {url}: {_from_study(trials, raw, stored)}"
    # The clock of the progress plot: each trial's cost (start-up and teardown included), one
    # after another. The study's timestamps are not used: the probe's trials are added to it
    # together, after the last of them ran.
    clock = 0.0
    for t in trials:
        clock += t.wall_s
        t.end_s = clock
    return ReportData(
        file=str(path),
        machine=machine,
        workload=workload,
        entry=entry,
        trials=trials,
        study_note=note,
        time_axis="seconds of trials (each one's cost, start-up included, one after another)",
    )


# -- series shared by the interactive page and the images ------------------------------------


@dataclass
class RateSeries:
    """The measured trials of one batch size: points, their spread, and the median per
    ``num_workers``."""

    batch_size: int
    trials: list[Trial]
    median_x: list[int]
    median_y: list[float]


def rate_series(data: ReportData) -> list[RateSeries]:
    out = []
    for bs in data.batch_sizes():
        pts = [t for t in data.measured if t.config.batch_size == bs]
        by_workers: dict[int, list[float]] = {}
        for t in pts:
            if t.status == "ok":  # a pruned trial's rate is that of a stopped window
                by_workers.setdefault(t.config.num_workers, []).append(t.rate)
        xs = sorted(by_workers)
        out.append(RateSeries(bs, pts, xs, [statistics.median(by_workers[x]) for x in xs]))
    return out


def spread(trial: Trial) -> tuple[float, float]:
    """How far the sub-window rates reach below and above the trial's rate (0, 0 if unknown)."""
    subs = [r for r in trial.sub_window_samples_per_s if r > 0]
    rate = trial.rate
    if len(subs) < 2:
        return 0.0, 0.0
    return max(0.0, rate - min(subs)), max(0.0, max(subs) - rate)


def best_so_far(data: ReportData) -> tuple[list[float], list[float]]:
    """The best rate measured so far at the end of each trial (a step line)."""
    xs, ys, best = [], [], 0.0
    for t in data.trials:
        if t.measured and t.status == "ok":
            best = max(best, t.rate)
            xs.append(t.end_s)
            ys.append(best)
    return xs, ys


def pss_mib(trial: Trial) -> float | None:
    return None if trial.pss_bytes is None else trial.pss_bytes / MIB
