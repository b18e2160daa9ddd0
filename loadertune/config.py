"""One DataLoader setting (:class:`Config`): the five keywords loadertune tunes, under
DataLoader's own names, with DataLoader's own rules for which combinations are valid."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from loadertune.errors import ConfigError

TUNED_KEYS = ("batch_size", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
TORCH_DEFAULT_PREFETCH = 2  # what DataLoader uses when num_workers > 0 and prefetch_factor=None
DEFAULT_BATCH_SIZES = (16, 32, 64, 128, 256, 512)


@dataclass(frozen=True, order=True)
class Config:
    """One DataLoader setting. Invalid combinations raise ``ConfigError`` on construction.

    ``prefetch_factor`` is None exactly when ``num_workers == 0`` (DataLoader's own rule);
    with workers and no value it becomes torch's default, 2.
    """

    batch_size: int
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        if (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or self.batch_size < 1
        ):
            raise ConfigError(f"batch_size must be a positive int, but got {self.batch_size!r}.")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ConfigError(f"num_workers must be an int >= 0, but got {self.num_workers!r}.")
        if self.num_workers == 0:
            if self.prefetch_factor is not None:
                raise ConfigError(
                    "prefetch_factor needs num_workers > 0, but got "
                    f"{self.prefetch_factor!r} with num_workers=0."
                )
            if self.persistent_workers:
                raise ConfigError("persistent_workers=True needs num_workers > 0.")
        elif self.prefetch_factor is None:
            object.__setattr__(self, "prefetch_factor", TORCH_DEFAULT_PREFETCH)
        elif self.prefetch_factor < 1:
            raise ConfigError(f"prefetch_factor must be >= 1, but got {self.prefetch_factor!r}.")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], *, batch_size: int | None = None) -> Config:
        """Build from DataLoader keyword arguments; other keys are ignored."""
        picked = {k: kwargs[k] for k in TUNED_KEYS if k in kwargs and kwargs[k] is not None}
        if "batch_size" not in picked:
            if batch_size is None:
                raise ConfigError("batch_size is missing; pass it in the settings.")
            picked["batch_size"] = batch_size
        return cls(**picked)

    def loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader``, under DataLoader's own names."""
        kwargs = asdict(self)
        if self.num_workers == 0:
            del kwargs["prefetch_factor"]
        return kwargs

    @property
    def in_flight_batches(self) -> int:
        """Batches produced ahead of the training loop: ``num_workers * prefetch_factor``."""
        return self.num_workers * (self.prefetch_factor or 0)

    def label(self) -> str:
        """Short human form, e.g. ``bs=64 w=4 pf=2 pin persist``."""
        parts = [f"bs={self.batch_size}", f"w={self.num_workers}"]
        if self.num_workers:
            parts.append(f"pf={self.prefetch_factor}")
        if self.pin_memory:
            parts.append("pin")
        if self.persistent_workers:
            parts.append("persist")
        return " ".join(parts)


def kwargs_label(kwargs: Mapping[str, Any]) -> str:
    """:meth:`Config.label` of DataLoader keyword arguments; without ``batch_size`` (a batch
    sampler decides it), ``bs=sampler``."""
    if kwargs.get("batch_size") is not None:
        return Config.from_kwargs(kwargs).label()
    label = Config.from_kwargs(kwargs, batch_size=1).label()
    return "bs=sampler" + label[len("bs=1") :]


def normalize_batch_sizes(batch_size: int | Iterable[int] | None) -> tuple[int, ...]:
    """The candidates: the int itself, the sorted list, or powers of two when None."""
    if batch_size is None:
        return DEFAULT_BATCH_SIZES
    if isinstance(batch_size, bool):
        raise ConfigError(f"batch_size must be an int or a list of ints, but got {batch_size!r}.")
    if isinstance(batch_size, int):
        values: tuple[int, ...] = (batch_size,)
    else:
        values = tuple(batch_size)
        if not values:
            raise ConfigError("batch_size is an empty list; give at least one candidate.")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise ConfigError(
            f"every batch size must be a positive int, but got {bad} in {batch_size!r}."
        )
    return tuple(sorted(set(values)))


def check_max_workers(max_workers: int | None, logical_cpus: int) -> None:
    """Reject a ``max_workers`` no machine could use, with the value and the sensible range."""
    if max_workers is None:
        return
    sensible = max(64, 8 * logical_cpus)
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 0:
        raise ConfigError(f"max_workers must be an int >= 0, but got {max_workers!r}.")
    if max_workers > sensible:
        raise ConfigError(
            f"max_workers={max_workers} is more than anything sensible on this machine "
            f"({logical_cpus} logical CPUs); pass at most {sensible}."
        )
