"""Which loader a script trial tunes.

Named by the user (``--loader N``, ``--loader FILE:LINE``) or by the first trial of a search (the
key of the loader it found, :mod:`loadertune.trials.inside.identity`), or else found the way the
user means it: **the loader that feeds the optimizer**. Every ``optimizer.step()`` (torch's global
step hook, so every optimizer of every framework) is fed by the loader that yielded the last
batch before it, or, when several yielded since the step before (a loop over ``zip(main,
aux)``), by the one the loop waited on most: of those, the one whose ``next()`` calls took at
least :data:`WAIT_DECIDES` times as long as each other's so far, the training's time the
settings can win back (by epoch length alone, a ``zip`` of an image dataset with a larger
in-memory one would tune the in-memory one); where no wait stands out, the one with the most
samples per epoch (``itertools.cycle(aux)`` repeats a short one). The first loader to feed two
steps is the training loader. Lightning's sanity check iterates the validation loader first,
and evaluation loops iterate other loaders between epochs: none of them is stepped on.

A loop without an optimizer (inference, a loader benchmarked alone) has no step: there the loader
whose measured window fills first is the one, as long as no optimizer exists at all (an optimizer
that has not stepped yet means training has not started: an evaluation before training must not
be taken for it).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from loadertune.trials.inside.identity import LoaderRecord, names_site, same_key


class Selector:
    """The loader a trial's spec names: ``key`` (found by an earlier trial), ``index`` (order of
    creation) or ``call_site`` (``FILE:LINE``); :attr:`named` is False when it names none."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.key: tuple[str, ...] | None = tuple(spec["key"]) if spec.get("key") else None
        self.index: int | None = spec.get("index")
        self.call_site: str | None = spec.get("call_site") or None

    @property
    def named(self) -> bool:
        return self.key is not None or self.index is not None or self.call_site is not None

    def names(self, record: LoaderRecord) -> bool:
        if self.key is not None:
            return same_key(record.identity, self.key)
        if self.index is not None:
            return record.index == self.index
        if self.call_site is not None:
            return names_site(record, self.call_site)
        return False


# Of loaders zipped into each step, one whose next() calls took this many times as long as each
# other's is the one the step waits on (see the module docstring).
WAIT_DECIDES = 2.0


class FeedWatch:
    """Finds the loader that feeds the optimizer (see the module docstring).

    Call :meth:`yielded` for each batch a loader yields until :attr:`fed` is set. At each
    optimizer step, the loader that yielded the last batch gets a vote, or of several that
    yielded since the step before, the one the loop waited on most, or else the one with the most
    samples per epoch (``epoch_samples`` of its key; unknown counts as none) (see
    :meth:`_feeder`); the first to get ``VOTES`` is the one (so that a batch
    of another loader drawn inside a training step, now and then, does not decide).
    ``on_found`` is called once with its key, from inside ``optimizer.step()``.
    """

    VOTES = 2

    def __init__(
        self,
        on_found: Callable[[tuple[str, ...]], None],
        epoch_samples: Callable[[tuple[str, ...]], int | None] = lambda key: None,
    ) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._on_found = on_found
        self._epoch_samples = epoch_samples
        self._votes: dict[tuple[str, ...], int] = {}
        self._since: dict[tuple[str, ...], None] = {}  # yielded since the last step, in order
        self._waited: dict[tuple[str, ...], float] = {}  # seconds in its next() calls so far
        # the others that yielded before the step that decided (in order)
        self.alongside: dict[tuple[str, ...], None] = {}
        self.steps = 0
        self.fed: tuple[str, ...] | None = None
        self._handle = register_optimizer_step_pre_hook(self._on_step)

    def yielded(self, key: tuple[str, ...], wait_s: float = 0.0) -> None:
        """``key``'s loader gave a batch, after ``wait_s`` seconds in its ``next()``."""
        self._since.pop(key, None)
        self._since[key] = None  # the last to yield, last
        self._waited[key] = self._waited.get(key, 0.0) + wait_s

    def also_fed(self, records: Mapping[tuple[str, ...], LoaderRecord]) -> list[str]:
        """Other loaders that yielded beside the chosen one before the step that chose it (a
        ``zip`` of two), as warnings: the user may mean another. ``records``: each key's."""
        out = []
        for key in self.alongside:
            record = records.get(key)
            if record is not None:
                out.append(
                    f"DataLoader #{record.index} at {record.call_site} also fed the optimizer's "
                    f"steps (--loader {record.index} tunes it instead)"
                )
        return out

    def _on_step(self, optimizer: object, args: object, kwargs: object) -> None:
        self.steps += 1
        since, self._since = list(self._since), {}
        if self.fed is not None or not since:
            return
        key = self._feeder(since)
        self._votes[key] = self._votes.get(key, 0) + 1
        if self._votes[key] >= self.VOTES:
            self.alongside = {k: None for k in since if k != key}
        if self._votes[key] >= self.VOTES:
            self.fed = key
            self.close()
            self._on_found(key)

    def _feeder(self, since: list[tuple[str, ...]]) -> tuple[str, ...]:
        """Of the loaders that yielded since the step before (in order), the one the loop waited
        on most by :data:`WAIT_DECIDES` or more; else the last to yield, unless another has a
        longer epoch."""
        if len(since) > 1:
            waited = sorted(since, key=lambda k: self._waited.get(k, 0.0), reverse=True)
            most, runner_up = (self._waited.get(k, 0.0) for k in waited[:2])
            if most > 0 and most >= WAIT_DECIDES * runner_up:
                return waited[0]
        return max(reversed(since), key=lambda k: self._epoch_samples(k) or 0)

    def close(self) -> None:
        self._handle.remove()


def optimizer_exists() -> bool:
    """Whether any torch optimizer exists in this process (once, when it matters: a scan of the
    garbage collector's objects). Quietly: ``isinstance`` on some objects warns
    (``torch.distributed.reduce_op``'s FutureWarning), which would reach the user's output
    from loadertune's own line."""
    from torch.optim import Optimizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return any(isinstance(obj, Optimizer) for obj in gc.get_objects())
