"""PyTorch Lightning: tune the training dataloader from inside Lightning, and use saved settings.

::

    from loadertune.integrations.lightning import LoadertuneCallback

    trainer = L.Trainer(callbacks=[LoadertuneCallback("loadertune.json")])
    trainer.fit(model, datamodule=dm)

At ``setup``, before Lightning asks for the training dataloader, the callback looks in the file
for this machine's entry for the loader's dataset (its type, as ``tune_loader`` saves it). With
none there (and ``tune=True``), it tunes that loader first: :func:`loadertune.tune_loader` over
its dataset with everything else of the loader kept (sampler, collate_fn, drop_last, ...), its
own settings as the baseline, and saves the result. Then the training dataloader Lightning gets
is rebuilt with the saved settings: a loader passed to ``fit()``, or the one the DataModule's or
the LightningModule's ``train_dataloader()`` returns (at every call, so
``reload_dataloaders_every_n_epochs`` keeps them). Validation loaders are left alone.

Tuning here measures the loader's own rate (and ``step``'s, when given), not Lightning's whole
training step: ``loadertune search train.py`` measures the script's real loop instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from loadertune.api import tune_loader
from loadertune.api.saved import load_recommendation
from loadertune.config import Config, kwargs_label
from loadertune.errors import ConfigError, NoRecommendationError
from loadertune.results.recommendation import Recommendation
from loadertune.trials import loader as dl


def fixed_arguments(loader: DataLoader[Any]) -> dict[str, Any]:
    """The arguments of ``loader`` that ``tune_loader`` keeps as they are (all but the five it
    tunes), its default samplers said as ``shuffle`` so that another batch size is possible."""
    arguments = dl.arguments_of(loader)
    arguments.pop("dataset")
    for key in ("batch_size", "num_workers", "prefetch_factor", "pin_memory"):
        arguments.pop(key, None)
    arguments.pop("persistent_workers", None)
    sampler = arguments.pop("sampler", None)
    if isinstance(sampler, RandomSampler) and not sampler.replacement:
        arguments["shuffle"] = True
    elif sampler is not None and not isinstance(sampler, SequentialSampler):
        arguments["sampler"] = sampler
    return {k: v for k, v in arguments.items() if v is not None}


def tune_dataloader(
    loader: DataLoader[Any],
    *,
    budget_s: float = 60.0,
    batch_size: int | list[int] | None = None,
    step: Callable[[Any], Any] | None = None,
    **tune_kwargs: Any,
) -> Recommendation:
    """Tune a training dataloader as Lightning would build it: its dataset and its other
    arguments kept, its own settings the baseline. ``batch_size`` defaults to the loader's own
    (a batch sampler keeps deciding it). Returns :func:`loadertune.tune_loader`'s answer."""
    own = dl.settings_of(loader)
    fixed = fixed_arguments(loader)
    if "batch_sampler" in fixed:
        batch_size = None
    return tune_loader(
        loader.dataset,
        batch_size=batch_size if batch_size is not None else own.batch_size,
        baseline=own.loader_kwargs(),
        step=step,
        budget_s=budget_s,
        **tune_kwargs,
        **fixed,
    )


class LoadertuneCallback(pl.Callback):
    """Tunes (when the file has no entry for it) and applies this machine's settings to the
    training dataloader; see the module docstring.

    Args:
        path: the recommendation file.
        tune: tune the loader when the file has no entry for it (False: leave it as it is).
        budget_s: the tuning's budget.
        step: a function of a batch to measure with the loading (None: loading alone).
        verbose: print what is tuned and applied.
        **tune_kwargs: more options of :func:`loadertune.tune_loader` (``max_workers``...).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = "loadertune.json",
        *,
        tune: bool = True,
        budget_s: float = 60.0,
        step: Callable[[Any], Any] | None = None,
        verbose: bool = True,
        **tune_kwargs: Any,
    ) -> None:
        self.path = path
        self.tune = tune
        self.budget_s = budget_s
        self.step = step
        self.verbose = verbose
        self.tune_kwargs = tune_kwargs
        self.applied: dict[str, Any] | None = None  # the settings given to the loader

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        source = getattr(trainer.fit_loop, "_data_source", None)  # Lightning 2.x: where the
        if source is None or not hasattr(source, "instance"):  # training loader comes from
            raise ConfigError(
                "this Lightning version does not say where the training dataloader comes "
                "from (fit_loop._data_source); apply the settings yourself: "
                "DataLoader(dataset, **load_recommendation(path, workload=dataset))"
            )
        if isinstance(source.instance, DataLoader):
            source.instance = self._settle(source.instance)
            return
        owner = source.instance  # a LightningModule or a DataModule (whichever defines it)
        if owner is None or not callable(getattr(owner, source.name, None)):
            return
        original = getattr(owner, source.name)

        def train_dataloader() -> Any:
            loader = original()
            return self._settle(loader) if isinstance(loader, DataLoader) else loader

        setattr(owner, source.name, train_dataloader)

    def _settle(self, loader: DataLoader[Any]) -> DataLoader[Any]:
        """``loader`` rebuilt with the saved settings for its dataset, tuned first if none are
        saved (and ``tune``)."""
        try:
            kwargs = load_recommendation(self.path, workload=loader.dataset)
        except NoRecommendationError:
            if not self.tune:
                return loader
            rec = tune_dataloader(
                loader,
                budget_s=self.budget_s,
                step=self.step,
                verbose=self.verbose,
                **self.tune_kwargs,
            )
            rec.save(self.path)
            kwargs = rec.loader_kwargs
        self.applied = dict(kwargs)
        if self.verbose:
            print(f"loadertune: the training dataloader gets {kwargs_label(kwargs)}", flush=True)
        own = dl.settings_of(loader).batch_size
        return dl.rebuilt(loader, Config.from_kwargs(kwargs, batch_size=own))
