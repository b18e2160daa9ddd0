"""The GPU benchmark: a CPU image pipeline feeding a real CNN on the GPU.

JPEG decode + augmentation on the CPU (the examples' data set) feeds a ResNet-style network
trained with SGD+momentum on the GPU, at two or three batch sizes. It prints:

1. side by side, in interleaved rounds: the grid's best, the tuner's pick (``budget_s=60``),
   PyTorch's defaults and the folklore setting (``num_workers=4, pin_memory=True``), each with
   samples/s, the fraction of time blocked on data and the NVML GPU utilization;
2. host-to-device copies of one batch, pinned against pageable;
3. the memory model: peaks at three batch sizes, the fitted fixed and per-sample parts, the
   largest batch predicted to fit (10% margin), and the largest that really fits, found by
   doubling then bisecting on real out-of-memory errors.

The grid is kept small enough for the device time a session has (about 30 minutes):

    python scripts/bench_gpu.py --out bench-results/bench_gpu.json        # about 8 minutes
    python scripts/bench_gpu.py --cpu-smoke                               # code paths, no GPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadertune import hardware, tune_loader
from loadertune.config import Config
from loadertune.search.confirm import interleaved
from loadertune.search.memory import MIB, fit
from loadertune.trials import Limits, TrialResult, cuda, window_for
from loadertune.trials.inline import InlineRunner

from bench_workloads import train_images

LIMITS = Limits(timeout_s=180, startup_s=120, hang_s=60)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet(width: int = 64, classes: int = 10) -> nn.Module:
    """ResNet-18's shape: 4 stages of 2 basic blocks."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(True),
    ]
    cin = width
    for i, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
        layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class Trainer:
    """``step(batch)``: one SGD step of the network on ``device`` (the copy included)."""

    def __init__(self, device: torch.device, width: int) -> None:
        self.device = device
        self.model = resnet(width).to(device).to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

    def __call__(self, batch: Any) -> None:
        images, labels = batch
        images = images.to(self.device, non_blocking=True).to(memory_format=torch.channels_last)
        labels = labels.to(self.device, non_blocking=True)
        loss = nn.functional.cross_entropy(self.model(images), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def measure(
    runner: InlineRunner, config: Config, window_s: float, phase: str = "search"
) -> TrialResult:
    return runner.run(
        config, window=window_for(config, window_s=window_s), limits=LIMITS, phase=phase
    )


def figures(results: list[TrialResult]) -> dict[str, Any]:
    ok = [r for r in results if r.ok and r.measurement]
    if not ok:
        return {"error": results[0].error if results else "no result"}
    util = [u for r in ok if r.resources for u in r.resources.gpu_util_percent]
    return {
        "samples_per_s": statistics.median(r.epoch_samples_per_s or 0.0 for r in ok),
        "rounds": [r.epoch_samples_per_s for r in ok],
        "blocked_fraction": statistics.median(
            r.measurement.blocked_fraction for r in ok if r.measurement
        ),
        "gpu_util_mean": statistics.fmean(util) if util else None,
        "gpu_util_samples": len(util),
    }


def largest_fitting_batch(runner: InlineRunner, start: int, limit: int) -> int:
    """Double until a real OOM, then bisect (Lightning's binsearch, on real trials)."""
    good, bad = 0, None
    size = start
    while size <= limit:
        if measure(runner, Config(size), 0.2, phase="replay").error == "oom":
            bad = size
            break
        good, size = size, size * 2
    if bad is None:
        return good
    while bad - good > max(1, good // 64):
        mid = (good + bad) // 2
        if measure(runner, Config(mid), 0.2, phase="replay").error == "oom":
            bad = mid
        else:
            good = mid
    return good


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", default="64,128,256")
    ap.add_argument("--workers", default="0,2,4,8,12,16", help="grid values of num_workers")
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=1.5)
    ap.add_argument("--grid-window", type=float, default=1.0)
    ap.add_argument("--width", type=int, default=64, help="network width (ResNet-18: 64)")
    ap.add_argument("--n-images", type=int, default=6000)
    ap.add_argument("--crop", type=int, default=128)
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="tiny sizes on the CPU: code paths only"
    )
    ap.add_argument("--out", default="bench-results/bench_gpu.json")
    args = ap.parse_args()
    if args.cpu_smoke:
        args.batch_sizes, args.workers, args.budget, args.rounds = "8,16", "0,2", 8.0, 1
        args.window = args.grid_window = 0.3
        args.width, args.n_images, args.crop = 8, 300, 32
    elif not torch.cuda.is_available():
        ap.error("no CUDA device: run it on a GPU machine, or pass --cpu-smoke")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu_smoke else "cpu")
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    hw = hardware.detect()
    print(f"machine: {hw.describe()}\ncommand: python {' '.join(sys.argv)}", flush=True)

    root = train_images.example_cache_dir() / f"images-{args.n_images}-{args.crop}"
    train_images.make_image_folder(root, args.n_images, image_size=args.crop + args.crop // 2)
    paths, labels = train_images.list_images(root)
    dataset = train_images.ImageFolderDataset(paths, labels, crop=args.crop, train=True)
    step = Trainer(device, args.width)
    runner = InlineRunner(dataset, step=step, fixed={"shuffle": True, "drop_last": True})
    out: dict[str, Any] = {
        "machine": hw.describe(),
        "command": " ".join(sys.argv),
        "args": vars(args),
    }

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rec = tune_loader(
            dataset,
            batch_size=sizes,
            step=step,
            budget_s=args.budget,
            shuffle=True,
            drop_last=True,
            storage=f"sqlite:///{tmp}/gpu.db",
            resume=False,
            verbose=False,
        )
    pick = Config.from_kwargs(rec.loader_kwargs)
    out["tuner"] = {
        "pick": pick.label(),
        "wall_s": time.monotonic() - t0,
        "trials": len(rec.trials),
        "stop": rec.search["stop_reason"],
        "diagnosis": rec.diagnosis,
    }
    print(
        f"tuner: {pick.label()} in {out['tuner']['wall_s']:.0f} s ({len(rec.trials)} trials)",
        flush=True,
    )

    pins = (False, True) if device.type == "cuda" else (False,)
    grid: dict[Config, float] = {}
    for bs, w, pin in itertools.product(sizes, [int(x) for x in args.workers.split(",")], pins):
        config = Config(bs, w, 2 if w else None, pin, bool(w))
        grid[config] = measure(runner, config, args.grid_window).epoch_samples_per_s or 0.0
    top = sorted(grid, key=lambda c: grid[c], reverse=True)[:2]
    user_bs = sizes[0]
    finalists = list(
        dict.fromkeys([*top, pick, Config(user_bs), Config(user_bs, 4, 2, pin_memory=True)])
    )
    rounds: dict[Config, list[TrialResult]] = {c: [] for c in finalists}
    for config in interleaved(finalists, args.rounds):
        rounds[config].append(measure(runner, config, args.window))
    side = {c.label(): figures(r) for c, r in rounds.items()}
    names = {
        top[0].label(): "grid best",
        pick.label(): "tuner",
        Config(user_bs).label(): "defaults",
        Config(user_bs, 4, 2, pin_memory=True).label(): "folklore",
    }
    out["side_by_side"] = {names.get(k, k): {"setting": k, **v} for k, v in side.items()}
    print("\n| | setting | samples/s | blocked | GPU util | NVML samples |")
    print("|---|---|---:|---:|---:|---:|")
    for k, v in side.items():
        util = "-" if v.get("gpu_util_mean") is None else f"{v['gpu_util_mean']:.0f}%"
        print(
            f"| {names.get(k, '')} | {k} | {v.get('samples_per_s', 0):,.0f} | "
            f"{100 * v.get('blocked_fraction', 0):.0f}% | {util} | {v.get('gpu_util_samples', 0)} |"
        )

    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=max(sizes))))
    out["transfer"] = cuda.transfer_rates(batch, repeats=20)
    print(f"\nhost-to-device, batch {max(sizes)}: {out['transfer']}")

    points = []
    for bs in sizes:
        r = measure(runner, Config(bs), 0.3, phase="replay")
        points.append((bs, r.cuda_peak_reserved_bytes or 0))
        capacity = r.cuda_capacity_bytes
    model = fit(points) if device.type == "cuda" else None
    if model is not None and capacity:
        predicted = model.max_batch_size(capacity, margin=0.10)
        actual = largest_fitting_batch(runner, max(sizes), limit=1 << 16)
        out["memory"] = {
            "points_mib": [(b, p / MIB) for b, p in points],
            "fixed_mib": model.fixed_bytes / MIB,
            "per_sample_mib": model.per_sample_bytes / MIB,
            "capacity_mib": capacity / MIB,
            "predicted_max_batch_10pct_margin": predicted,
            "largest_that_fits": actual,
        }
        fixed_mib, per_mib = model.fixed_bytes / MIB, model.per_sample_bytes / MIB
        print(
            f"\nmemory: fixed {fixed_mib:,.0f} MiB + {per_mib:.2f} MiB/sample; predicted "
            f"largest batch (10% margin) {predicted}; largest that fits {actual}"
        )
    runner.close()
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
