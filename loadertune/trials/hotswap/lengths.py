"""How long a :class:`~loadertune.trials.hotswap.swap.HotSwap`'s epochs are, for each setting:
its samples, its batches, and what is left of the epoch under way.

**A script that asked its loader's length gets no more batches per epoch** (in a trial process:
``keep_length``). A smaller batch size, or the replay's one batch handed over again and again,
would give an epoch more batches than ``len(loader)`` said, and a script may count on it: a
``OneCycleLR`` sized by ``epochs * len(loader)`` raises at the step past its last. Once anything
has asked the length (:func:`~loadertune.trials.inside.patch.promised_batches`), an epoch ends after
that many batches, and the rest of its samples are left out: a trial measures the loop, not the
training, and every later epoch starts whole. A real training run (``keep_length=False``) keeps
every sample instead: there a smaller batch size the user allowed gives more steps per epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from loadertune.config import Config
from loadertune.trials import loader as dl
from loadertune.trials.hotswap.segment import EpochOrder
from loadertune.trials.hotswap.steps import Step
from loadertune.trials.inside.patch import promised_batches


class SwapLengths:
    """The epoch lengths of the script's ``loader`` (replaced when the script creates it again).

    Args:
        loader: the script's loader.
        regroup: the swap regroups samples into each setting's batches (False: the script's
            batch sampler decides the batches).
        keep_length: an epoch gives at most ``len(loader)`` batches once anything has asked it
            (see the module docstring); False: every sample of every epoch.
    """

    def __init__(self, loader: DataLoader[Any], *, regroup: bool, keep_length: bool) -> None:
        self.loader = loader
        self.regroup = regroup
        self.keep_length = keep_length
        self._promised: tuple[DataLoader[Any], int] | None = None  # len(loader), once asked
        self.sampler_samples: int | None = None  # an epoch of a batch sampler's own batches

    def limit(self) -> Callable[[], int | None] | None:
        """What tells an epoch how many batches it may give the script (see the module
        docstring): None in a real run, which keeps every sample."""
        return self._batches_promised if self.keep_length else None

    def _batches_promised(self) -> int | None:
        loader = self.loader  # (a loader created again replaces it)
        if self._promised is not None and self._promised[0] is loader:
            return self._promised[1]  # asked once, said for good: not its dataset's len() again
        promised = promised_batches(loader)
        if promised is not None:
            self._promised = (loader, promised)
        return promised

    def epoch_samples(self, config: Config, order: EpochOrder | None) -> int | None:
        """Samples per epoch with ``config`` (None: unknown). Where the script's batch sampler
        decides, its own: from its ``batch_size``, or else from its batches
        (:meth:`EpochOrder.samples` of ``order``, the epoch under way)."""
        if not self.regroup:
            known = dl.epoch_samples(self.loader)
            if known is None and order is not None:
                # (an epoch just begun has taken no batch yet: the last epoch's figure)
                self.sampler_samples = order.samples() or self.sampler_samples
                return self.sampler_samples
            return known
        try:
            n = len(self.loader.sampler)  # type: ignore[arg-type]
        except TypeError:
            return None
        return n // config.batch_size * config.batch_size if self.loader.drop_last else n

    def epoch_batches(self, step: Step, order: EpochOrder | None) -> int | None:
        """The batches a whole epoch gives ``step``'s setting (the script may count on no more:
        ``keep_length``); None where the batch sampler decides or the length is unknown."""
        n = self.epoch_samples(step.config, order)
        if not n or not self.regroup:
            return None
        batches = -(-n // step.config.batch_size)  # (with drop_last, n holds whole batches)
        promised = self.epoch_limit()
        return min(batches, promised) if promised else batches

    def epoch_limit(self) -> int | None:
        """The batches an epoch may give the script now (None: no limit; see :meth:`limit`)."""
        limit = self.limit()
        return limit() if limit is not None else None

    def batches_left(self, step: Step, order: EpochOrder) -> int | None:
        """The batches the epoch under way has left for ``step``'s setting, from the script's
        position in it (None: unknown): a whole-epoch window begun here runs across the epoch's
        end only where its warm-up is shorter (:func:`loadertune.measure.window.cycle_warmup`)."""
        if not self.regroup or order.length is None:
            return None
        bs = step.config.batch_size
        samples = order.length - order.position
        left = samples // bs if self.loader.drop_last else -(-samples // bs)
        promised = self.epoch_limit()
        return max(0, min(left, promised - order.given) if promised else left)
