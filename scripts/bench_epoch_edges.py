"""Does a trial's figure match what whole epochs run at, when epochs are short?

For each setting, a trial of ``tune_loader``'s in-process runner (its steady rate and its rate
per epoch, start-up included) is set against the truth: the same loader and step run for whole
epochs, timed from ``iter()`` to the epoch's end (the first epoch left out), median of
``--epochs``. The dataset computes (``--busy``, a spin of ``--sample-ms`` per sample: workers
and the step share the CPUs) or waits (a sleep: I/O). With epochs of a few rounds of the
workers, a window that holds an epoch's end also holds its tail (the workers have run out of
indices, so the step drains their buffer without sharing the CPUs) and the next epoch's first
round (made while the loop waited for its first batch): what this benchmark shows is how far
that moves a trial's figure from the truth.

    python scripts/bench_epoch_edges.py [--samples 2000] [--sample-ms 0.5] [--busy]
        [--step-ms 0] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from loadertune.config import Config
from loadertune.trials import Limits, TrialResult, window_for
from loadertune.trials.hotswap.steps import Outcome, Step
from loadertune.trials.hotswap.swap import HotSwap
from loadertune.trials.inline import InlineRunner

SETTINGS = [
    Config(32, 0),
    Config(32, 2, 2, persistent_workers=True),
    Config(32, 3, 4),
    Config(64, 3, 2, persistent_workers=True),
    Config(64, 6, 2),
    Config(128, 6, 2, persistent_workers=True),
    Config(128, 3, 4),
]


class Samples(Dataset[torch.Tensor]):
    def __init__(self, n: int, seconds: float, busy: bool) -> None:
        self.n, self.seconds, self.busy = n, seconds, busy

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.busy:
            t = time.perf_counter()
            while time.perf_counter() - t < self.seconds:
                pass
        else:
            time.sleep(self.seconds)
        return torch.zeros(32)


STEP_S = 0.0  # the loop's own work per batch (a spin: it shares the CPUs with the workers)
WINDOW_S = 0.75
WHOLE = False  # trials measure whole epochs (WindowSpec.whole_epoch)


def spin_step(batch: Any) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < STEP_S:
        pass


step: Any = spin_step


def images() -> Dataset[Any]:
    """``examples/train_images.py``'s training set and step: JPEGs decoded and augmented in
    the workers, a small CNN trained with torch's own threads, on the same CPUs."""
    global step
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import train_images as ex

    root = ex.make_image_folder(ex.example_cache_dir() / "images", 2000, 96)
    (paths, labels), _ = ex.split(*ex.list_images(root), seed=0)
    model = ex.SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()

    def train_step(batch: Any) -> None:
        x, y = batch
        loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step = train_step
    return ex.ImageFolderDataset(paths, labels, crop=64, train=True)


def whole_epochs(dataset: Dataset[Any], config: Config, epochs: int) -> float:
    loader = DataLoader(dataset, shuffle=True, **config.loader_kwargs())
    times = []
    for e in range(epochs + 1):
        t = time.perf_counter()
        for batch in loader:
            step(batch)
        if e:  # the first epoch starts the workers
            times.append(time.perf_counter() - t)
    del loader
    return len(dataset) / statistics.median(times)


class _InTurn:
    """A conductor that measures ``configs`` in turn, then keeps the last one running."""

    def __init__(self, configs: list[Config]) -> None:
        self.configs = list(configs)
        self.outcomes: list[Outcome] = []

    def next_step(self) -> Step | None:
        if not self.configs:
            return None
        config = self.configs.pop(0)
        return Step(config, window_for(config, window_s=WINDOW_S, whole_epoch=WHOLE))

    def finished(self, outcome: Outcome) -> bool:
        self.outcomes.append(outcome)
        return True


def trial(dataset: Dataset[Any], config: Config) -> TrialResult:
    """One trial of ``config`` as ``tune_loader`` runs it (a loader of its own, from an epoch's
    start)."""
    runner = InlineRunner(dataset, step=step, fixed={"shuffle": True})
    try:
        return runner.run(
            config,
            window=window_for(config, window_s=WINDOW_S, whole_epoch=WHOLE),
            limits=Limits(timeout_s=60, startup_s=30, hang_s=10),
        )
    finally:
        runner.close()


def swapped(dataset: Dataset[Any], reps: int) -> dict[Config, list[TrialResult]]:
    """Every setting ``reps`` times, in turn, hot-swapped under one loop (as a script's trial
    process runs them): each starts wherever the loop is in its epoch."""
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    conductor = _InTurn(SETTINGS * reps)
    swap = HotSwap(loader, conductor, fall_back=False)
    try:
        while conductor.configs or swap.measuring:
            for batch in swap.epoch():
                step(batch)
    finally:
        swap.close()
    out: dict[Config, list[TrialResult]] = {}
    for o in conductor.outcomes:
        result = TrialResult(
            o.step.config, measurement=o.measurement, epoch_samples=o.epoch_samples
        )
        out.setdefault(o.step.config, []).append(result)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--sample-ms", type=float, default=0.5)
    ap.add_argument("--busy", action="store_true", help="spin instead of sleeping")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=9)
    ap.add_argument("--step-ms", type=float, default=0.0, help="the step's spin per batch")
    ap.add_argument(
        "--swap", action="store_true", help="trials hot-swapped under one loop, as in a script"
    )
    ap.add_argument(
        "--images", action="store_true", help="the image example's dataset and training step"
    )
    ap.add_argument("--window", type=float, default=0.75, help="a trial's window, seconds")
    ap.add_argument(
        "--whole", action="store_true", help="trials measure whole epochs (--window: expected)"
    )
    args = ap.parse_args()
    global STEP_S, WINDOW_S, WHOLE
    STEP_S, WINDOW_S, WHOLE = args.step_ms / 1000, args.window, args.whole
    swap = ", hot-swapped" if args.swap else ""
    dataset: Dataset[Any]
    if args.images:
        dataset = images()
        print(f"the image example's {len(dataset)} images and CNN step{swap}", end=", ")  # type: ignore[arg-type]
    else:
        dataset = Samples(args.samples, args.sample_ms / 1000, args.busy)
        kind = ("spin" if args.busy else "sleep") + swap
        print(
            f"{args.samples} samples, {args.sample_ms} ms each ({kind}), "
            f"a step of {args.step_ms} ms",
            end=", ",
        )
    print("trials of whole epochs" if WHOLE else f"trials of {WINDOW_S} s windows")
    n_samples = len(dataset)  # type: ignore[arg-type]
    print(
        "| setting | batches/epoch | trial steady | trial per epoch | whole epochs "
        "| per epoch / whole |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    t0 = time.perf_counter()
    by_swap = swapped(dataset, args.reps) if args.swap else {}
    if by_swap:
        n_trials = sum(len(r) for r in by_swap.values())
        took = time.perf_counter() - t0
        each = took / n_trials
        print(f"(the {n_trials} hot-swapped trials took {took:.1f} s, {each:.2f} s each)")
    for config in SETTINGS:
        results = by_swap.get(config) or [trial(dataset, config) for _ in range(args.reps)]
        steady = [r.samples_per_s or 0.0 for r in results]
        per_epoch = [r.epoch_samples_per_s or 0.0 for r in results]
        truth = whole_epochs(dataset, config, args.epochs)
        est = statistics.median(per_epoch)
        print(
            f"| {config.label()} | {-(-n_samples // config.batch_size)} "
            f"| {statistics.median(steady):,.0f} ({min(steady):,.0f}..{max(steady):,.0f}) "
            f"| {est:,.0f} ({min(per_epoch):,.0f}..{max(per_epoch):,.0f}) "
            f"| {truth:,.0f} | {est / truth:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
