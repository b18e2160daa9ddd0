"""Whole-epoch trials of a Lightning script against its epochs timed by Lightning itself.

Lightning leaves each epoch by count (it asks exactly ``len(loader)`` batches and never meets
``StopIteration``), so a trial must end its epoch at the step on the last batch
(``Meter(epoch_batches=...)``). This sets the trials' figures beside the truth, for a few
settings of ``examples/train_lightning.py``'s training loader, in interleaved rounds:

* truth: the example's classes trained by a plain ``Trainer`` whose callback times each epoch
  from its first batch's step to its last batch's end (the first batch's wait, the workers'
  start-up, left out as a trial leaves it out), epochs after the first;
* trial: ``ScriptRunner`` runs the unmodified example (``--epochs 6``) and measures the setting
  over one whole epoch, three times in one launch after the baseline.

    python scripts/bench_lightning_epochs.py [--rounds 2] [--settings 128:4:4,64:2:2]

Prints each round's medians, and per setting the ratio of the trials' median to the truth's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_lightning.py"


def truth(bs: int, workers: int, pf: int, epochs: int = 5) -> list[float]:
    """Samples/s of each epoch after the first, timed by a Lightning callback added to the
    example's own Trainer (its ``main()`` runs as it is, with the training loader's setting)."""
    import functools

    import lightning as L
    from torch.utils.data import DataLoader

    sys.path.insert(0, str(EXAMPLE.parent))
    import train_lightning as example

    kw: dict = {"num_workers": workers, "persistent_workers": workers > 0}
    if workers:
        kw["prefetch_factor"] = pf

    def train_dataloader(self: example.Data) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, **kw)

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.rates: list[float] = []
            self.t0 = self.t1 = 0.0
            self.n = 0

        def on_train_batch_start(self, trainer, module, batch, idx) -> None:  # type: ignore[no-untyped-def]
            if idx == 0:
                self.t0, self.n = time.perf_counter(), 0

        def on_train_batch_end(self, trainer, module, out, batch, idx) -> None:  # type: ignore[no-untyped-def]
            self.n += len(batch[0])
            self.t1 = time.perf_counter()

        def on_train_epoch_end(self, trainer, module) -> None:  # type: ignore[no-untyped-def]
            self.rates.append(self.n / (self.t1 - self.t0))

    timer = Timer()
    example.Data.train_dataloader = train_dataloader  # type: ignore[method-assign]
    L.Trainer = functools.partial(L.Trainer, callbacks=[timer])  # type: ignore[misc]
    sys.argv = [str(EXAMPLE), "--epochs", str(epochs), "--batch-size", str(bs)]
    example.main()
    return timer.rates[1:]


def trials(bs: int, workers: int, pf: int, n: int = 3) -> list[float]:
    """Samples/s of ``n`` whole-epoch trials of the setting, in one launch of the example."""
    from loadertune.config import Config
    from loadertune.trials.contract import Limits, window_for
    from loadertune.trials.script.runner import ScriptRunner

    config = Config(bs, workers, pf if workers else None, False, workers > 0)
    runner = ScriptRunner(EXAMPLE, ["--epochs", "6"])
    limits = Limits(timeout_s=120, startup_s=60, hang_s=10)
    rates = []
    try:
        runner.run(None, window=window_for(Config(1), window_s=0.5), limits=limits)
        for _ in range(n):
            # the expected time only caps the window: the epoch's last batch ends it
            window = window_for(config, window_s=5.0, whole_epoch=True)
            r = runner.run(config, window=window, limits=limits)
            if r.ok and r.measurement is not None and r.measurement.whole_epoch:
                rates.append(r.measurement.samples_per_s)
    finally:
        runner.close()
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settings", default="128:4:4,64:2:2", help="bs:workers:prefetch, ...")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # "truth|trial bs:w:pf": run in a child
    args = ap.parse_args()
    if args.one:
        kind, setting = args.one.split()
        bs, w, pf = (int(x) for x in setting.split(":"))
        print(json.dumps(truth(bs, w, pf) if kind == "truth" else trials(bs, w, pf)))
        return 0
    settings = args.settings.split(",")
    got: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        kinds = ("truth", "trial") if r % 2 == 0 else ("trial", "truth")
        for setting in settings:
            for kind in kinds:  # each in a fresh process, as a user's run and a search are
                out = subprocess.run(
                    [sys.executable, __file__, "--one", f"{kind} {setting}"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                rates = json.loads(out.stdout.strip().splitlines()[-1])
                got.setdefault((setting, kind), []).extend(rates)
                med = statistics.median(rates) if rates else float("nan")
                print(
                    f"round {r + 1}  {setting:10} {kind:6} median {med:9,.0f}  {len(rates)} epochs"
                )
    print()
    for setting in settings:
        t, m = got.get((setting, "truth"), []), got.get((setting, "trial"), [])
        if t and m:
            ratio = statistics.median(m) / statistics.median(t)
            print(
                f"{setting:10} truth {statistics.median(t):9,.0f} ({min(t):,.0f}..{max(t):,.0f})  "
                f"trials {statistics.median(m):9,.0f} ({min(m):,.0f}..{max(m):,.0f})  "
                f"trial / truth {ratio:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
