"""loadertune: find the fastest PyTorch DataLoader settings for this machine.

Example:
    >>> from loadertune import tune_loader, load_recommendation
    >>> rec = tune_loader(dataset, batch_size=[32, 64, 128], step=train_step, budget_s=60)
    >>> rec.save("loadertune.json")
    >>> loader = DataLoader(dataset, **load_recommendation("loadertune.json"))
"""

from __future__ import annotations

from importlib import metadata as _metadata

try:  # the version lives in pyproject.toml only
    __version__ = _metadata.version("loadertune")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

from loadertune.api import tune_loader
from loadertune.api.live import tuned
from loadertune.api.saved import load_recommendation
from loadertune.errors import (
    ConfigError,
    LoadertuneError,
    NoRecommendationError,
    RecommendationFileError,
    ScriptError,
    SearchInterrupted,
    UserCodeError,
)
from loadertune.results.recommendation import Recommendation

__all__ = [
    "ConfigError",
    "LoadertuneError",
    "NoRecommendationError",
    "Recommendation",
    "RecommendationFileError",
    "ScriptError",
    "SearchInterrupted",
    "UserCodeError",
    "__version__",
    "load_recommendation",
    "tune_loader",
    "tuned",
]
