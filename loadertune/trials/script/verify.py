"""Did a trial run the setting it asked for? What the trial process saw its loader run with
(``ResultMsg["ran"]``: the settings as built, the workers its iterator started, the lengths of
the batches it yielded) against the trial's setting. A trial is never recorded under a setting
it did not run: a mismatch fails it, saying what ran.
"""

from __future__ import annotations

from typing import Any

from loadertune.config import Config
from loadertune.measure.failures import Failure, FailureKind


def lengths_show_batch_size(ran: dict[str, Any]) -> bool:
    """Whether the lengths of the batches tell the batch size (the first trial decides: its
    longest batch is the loader's own batch size). A custom collate may return what has no
    length (``structure_count`` then says 1): such batches verify nothing."""
    lengths = ran.get("batch_lengths") or []
    return bool(lengths) and max(lengths) == (ran.get("settings") or {}).get("batch_size")


def mismatch(config: Config, ran: dict[str, Any], *, check_lengths: bool) -> str | None:
    """What of ``config`` the loader did not run with (None: it ran with all of it)."""
    built = ran.get("settings") or {}
    wrong = [
        f"{name}={built.get(name)!r} (asked {want!r})"
        for name, want in config.loader_kwargs().items()
        if name in built and built.get(name) != want
    ]
    started = ran.get("workers_started")
    if started is not None and started != config.num_workers:
        wrong.append(f"{started} workers started (asked {config.num_workers})")
    lengths = ran.get("batch_lengths") or []
    if check_lengths and lengths and max(lengths) != config.batch_size:
        wrong.append(f"batches of {max(lengths)} samples (asked {config.batch_size})")
    return "; ".join(wrong) or None


def not_applied(config: Config, what: str) -> Failure:
    return Failure(
        FailureKind.NOT_APPLIED,
        f"the loader did not run with {config.label()}: {what}",
        "the loader is built in a way loadertune cannot change (a batch sampler, a wrapper); "
        "leave that setting out of the search (--batch-sizes) and report the script",
    )
