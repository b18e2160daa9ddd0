"""The exceptions loadertune raises. All share :class:`LoadertuneError`.

A failed *trial* is not an exception: it is recorded on the trial (see
``loadertune.measure.failures``) and the search goes on. These exceptions are for what stops a
whole call: bad input, the user's own bug, a recommendation file that cannot be read, an
interrupted search.
"""

from __future__ import annotations

from typing import Any

from loadertune import tracebacks


class LoadertuneError(Exception):
    """Base class of every error loadertune raises on purpose."""


class ConfigError(LoadertuneError, ValueError):
    """An argument or option is invalid. The message names the value and what to pass instead."""


class UserCodeError(LoadertuneError):
    """The user's own code failed in a way no DataLoader setting can fix.

    Its text opens with where the user's code raised (``train.py:42 in __getitem__:
    ValueError: ...``), then one line saying what happened and what to do, then the traceback
    with loadertune's, torch's and Python's own frames left out (each run of them marked).

    Attributes:
        kind: short machine-readable cause: ``"dataset_error"``, ``"step_error"``...
        detail: the user's traceback (and the script's output), as text, untrimmed.
        advice: what to do about it.
    """

    def __init__(self, message: str, *, kind: str, detail: str = "", advice: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = detail
        self.advice = advice

    def __str__(self) -> str:
        base = super().__str__()
        todo = f"{base}; {self.advice}" if self.advice else base
        if not self.detail:
            return todo
        trimmed = tracebacks.trim(self.detail.rstrip())
        if trimmed.origin is None:
            return f"{todo}\n\n{trimmed.text}"
        where = f"{trimmed.origin}: {trimmed.exception or 'raised'}"
        return f"{where}\n{todo}\n\n{trimmed.text}"


class ScriptError(UserCodeError):
    """A training script failed, or never iterated a DataLoader, for reasons of its own."""


class RecommendationFileError(LoadertuneError):
    """A recommendation file does not parse, has an unknown schema, or cannot be written."""


class NoRecommendationError(LoadertuneError, LookupError):
    """The recommendation file holds no entry for this machine (or this workload on it)."""


class PartialNotSaved(LoadertuneError):
    """A partial result (an interrupted search) was not saved: the file holds a complete one for
    the same machine and workload, which it never replaces."""


class SearchInterrupted(LoadertuneError, KeyboardInterrupt):
    """The search was stopped by Ctrl-C or SIGTERM; completed trials are kept in the study.

    Subclasses ``KeyboardInterrupt`` so that code which handles Ctrl-C keeps working.
    """

    def __init__(
        self,
        message: str,
        *,
        study_name: str,
        storage: str,
        n_complete: int,
        best: dict[str, Any] | None = None,
        workload: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.workload = workload  # what was tuned (as Recommendation.workload), where known
        self.study_name = study_name
        self.storage = storage
        self.n_complete = n_complete
        self.best = best  # the best setting so far: loader_kwargs, samples_per_s (None if none)

    @classmethod
    def kept(
        cls,
        *,
        study_name: str,
        storage: str,
        n_complete: int,
        best: dict[str, Any] | None,
        when: str = "",
        fresh: bool = False,
    ) -> SearchInterrupted:
        """The interrupt, saying what the study keeps and how to resume; ``when``: a phrase
        after "interrupted" (" as it finished"); ``fresh``: the search was told to start its
        study afresh (``--fresh``), which the same command would do again."""
        how = (
            "run it again with --resume instead of --fresh (in code: resume=True) to resume"
            if fresh
            else "run the same command again to resume"
        )
        return cls(
            f"search interrupted{when}; {n_complete} completed trials are kept in study "
            f"{study_name!r} ({storage}); {how}",
            study_name=study_name,
            storage=storage,
            n_complete=n_complete,
            best=best,
        )
