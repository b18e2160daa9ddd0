"""Train a small CNN on a folder of JPEG images (a plain PyTorch script, runnable on a CPU).

The first run writes a synthetic data set: ``--n-images`` JPEG files in 10 class folders
(``class_0`` ... ``class_9``), each a noisy picture whose colours and shapes depend on its class.
Later runs reuse it. Each sample is decoded with PIL and augmented on the CPU (random resized
crop, horizontal flip, colour jitter), as an image pipeline built on torchvision would, so the
DataLoader has real work to do.

Run it as is::

    python examples/train_images.py --epochs 1
    python examples/train_images.py --epochs 2 --num-workers 2 --batch-size 64

Let loadertune find the fastest DataLoader settings for it, unmodified::

    loadertune search examples/train_images.py -- --epochs 1

The data lives in ``~/.cache/loadertune-examples/images`` (``$LOADERTUNE_EXAMPLE_DATA/images``
when that variable is set), or wherever ``--data`` says.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import DataLoader, Dataset

N_CLASSES = 10
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
_MARKER = "dataset.json"


def example_cache_dir() -> Path:
    """Where the examples keep their generated data (``$LOADERTUNE_EXAMPLE_DATA`` overrides)."""
    root = os.environ.get("LOADERTUNE_EXAMPLE_DATA") or "~/.cache/loadertune-examples"
    return Path(root).expanduser()


# ---------------------------------------------------------------------------------------------
# Synthetic data set: JPEG files in class folders
# ---------------------------------------------------------------------------------------------


def _image_path(root: Path, index: int) -> Path:
    return root / f"class_{index % N_CLASSES}" / f"{index:06d}.jpg"


def _draw_image(index: int, size: int) -> Image.Image:
    """Image ``index`` (class ``index % 10``): a tinted noisy background and class-typed shapes."""
    label = index % N_CLASSES
    rng = np.random.default_rng(1_000_003 * size + index)
    hue = np.array([math.cos(2 * math.pi * (label / N_CLASSES + k / 3)) for k in range(3)])
    base = 128 + 70 * hue + rng.normal(0, 20, 3)
    # Low-frequency noise (upsampled), then pixel noise: textures a crop cannot remove.
    coarse = rng.normal(0, 30, (size // 8 + 1, size // 8 + 1, 3))
    coarse = np.kron(coarse, np.ones((8, 8, 1)))[:size, :size]
    pixels = base + coarse + rng.normal(0, 12, (size, size, 3))
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))

    draw = ImageDraw.Draw(img)
    shape = label % 5  # 5 shapes x 2 colour families = 10 classes
    fill = tuple(int(c) for c in np.clip(255 - base + rng.normal(0, 25, 3), 0, 255))
    for _ in range(int(rng.integers(1, 4))):
        r = size * rng.uniform(0.12, 0.28)
        cx, cy = rng.uniform(r, size - r, 2)
        box = (cx - r, cy - r, cx + r, cy + r)
        if shape == 0:
            draw.ellipse(box, fill=fill)
        elif shape == 1:
            draw.rectangle(box, fill=fill)
        elif shape == 2:
            draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
        elif shape == 3:
            draw.line([(cx - r, cy - r), (cx + r, cy + r)], fill=fill, width=max(2, size // 16))
            draw.line([(cx - r, cy + r), (cx + r, cy - r)], fill=fill, width=max(2, size // 16))
        else:
            for k in range(-2, 3):
                y = cy + k * r / 2.5
                draw.line([(cx - r, y), (cx + r, y)], fill=fill, width=max(1, size // 32))
    return img


_OURS = re.compile(r"(\d{6,}\.jpg|\.\d{6,}\.jpg\.\d+\.tmp)")


def _generated_here(root: Path) -> bool:
    """Whether ``root`` holds nothing but (possibly partial) output of :func:`make_image_folder`."""
    for entry in root.iterdir():
        if entry.name == _MARKER:
            continue
        if not (entry.is_dir() and re.fullmatch(r"class_\d+", entry.name)):
            return False
        if not all(_OURS.fullmatch(f.name) for f in entry.iterdir()):
            return False
    return True


def make_image_folder(
    root: str | os.PathLike[str], n_images: int, image_size: int, verbose: bool = True
) -> Path:
    """Write ``n_images`` JPEGs under ``root``; files already there (same size) are kept.

    Deterministic: image ``i`` is the same on every machine and run, whatever ``n_images`` is.
    Files from an earlier, larger data set are removed, so the folder holds exactly ``n_images``.
    A folder with anything else in it (your own images in class folders) is used as it is.
    """
    root = Path(root).expanduser()
    marker = root / _MARKER
    wanted = {"n_images": n_images, "image_size": image_size, "classes": N_CLASSES}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return root
    if root.is_dir() and not _generated_here(root):
        if verbose:
            print(f"{root} holds other files: using its images as they are")
        return root

    start = time.perf_counter()
    keep = {_image_path(root, i) for i in range(n_images)}
    old_size = None
    if marker.exists():
        old_size = json.loads(marker.read_text()).get("image_size")
        marker.unlink()
    for old in root.glob("class_*/*.jpg"):
        if old not in keep or old_size != image_size:
            old.unlink()
    for c in range(N_CLASSES):
        (root / f"class_{c}").mkdir(parents=True, exist_ok=True)
    written = 0
    for i in range(n_images):
        path = _image_path(root, i)
        if path.exists():
            continue
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        _draw_image(i, image_size).save(tmp, format="JPEG", quality=90)
        os.replace(tmp, path)
        written += 1
    marker.write_text(json.dumps(wanted))
    if verbose and written:
        print(
            f"wrote {written} JPEGs ({image_size}x{image_size}) to {root} "
            f"in {time.perf_counter() - start:.1f}s"
        )
    return root


def list_images(root: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """The files of an image folder (sorted) and their integer labels, as numpy arrays."""
    root = Path(root)

    def natural(name: str) -> list[int | str]:  # class_2 before class_10
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

    classes = sorted((d.name for d in root.iterdir() if d.is_dir()), key=natural)
    paths, labels = [], []
    for label, name in enumerate(classes):
        for f in sorted((root / name).iterdir()):
            if f.suffix.lower() in (".jpg", ".jpeg", ".png"):
                paths.append(str(f))
                labels.append(label)
    # numpy arrays instead of lists of Python objects: no refcount writes, so no copy-on-write
    # growth of the forked workers' memory.
    return np.array(paths), np.array(labels, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Dataset with CPU augmentation (what torchvision.transforms would do, with PIL and numpy)
# ---------------------------------------------------------------------------------------------


def random_resized_crop(
    img: Image.Image,
    size: int,
    scale: tuple[float, float] = (0.35, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Image.Image:
    w, h = img.size
    area = w * h
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = random.randint(0, w - cw), random.randint(0, h - ch)
            return img.resize((size, size), Image.BILINEAR, box=(x, y, x + cw, y + ch))
    return center_crop(img, size, 1.0)


def center_crop(img: Image.Image, size: int, fraction: float = 0.875) -> Image.Image:
    w, h = img.size
    side = min(w, h) * fraction
    x, y = (w - side) / 2, (h - side) / 2
    return img.resize((size, size), Image.BILINEAR, box=(x, y, x + side, y + side))


def color_jitter(x: np.ndarray, strength: float = 0.2) -> np.ndarray:
    """Random brightness, contrast and saturation on an HWC float image in [0, 1]."""
    x = x * random.uniform(1 - strength, 1 + strength)
    mean = x.mean()
    x = (x - mean) * random.uniform(1 - strength, 1 + strength) + mean
    gray = x @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    x = (x - gray[..., None]) * random.uniform(1 - strength, 1 + strength) + gray[..., None]
    return np.clip(x, 0.0, 1.0)


class ImageFolderDataset(Dataset):
    """JPEG files and labels; ``__getitem__`` decodes, augments and normalizes one image."""

    def __init__(
        self, paths: np.ndarray, labels: np.ndarray, crop: int = 64, train: bool = True
    ) -> None:
        self.paths, self.labels = paths, labels
        self.crop, self.train = crop, train

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[index]) as f:
            img = f.convert("RGB")
        if self.train:
            img = random_resized_crop(img, self.crop)
            if random.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
        else:
            img = center_crop(img, self.crop)
        x = np.asarray(img, dtype=np.float32) / 255.0
        if self.train:
            x = color_jitter(x)
        x = (x - MEAN) / STD
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), int(self.labels[index])


def split(paths: np.ndarray, labels: np.ndarray, val_fraction: float = 0.1, seed: int = 0):
    order = np.random.default_rng(seed).permutation(len(paths))
    n_val = max(1, int(len(paths) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    return (paths[train], labels[train]), (paths[val], labels[val])


# ---------------------------------------------------------------------------------------------
# Model and training loop
# ---------------------------------------------------------------------------------------------


def conv_block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    def __init__(self, n_classes: int = N_CLASSES, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            conv_block(3, width, stride=2),  # 64 -> 32
            conv_block(width, 2 * width),
            nn.MaxPool2d(2),  # 32 -> 16
            conv_block(2 * width, 4 * width),
            nn.MaxPool2d(2),  # 16 -> 8
            conv_block(4 * width, 8 * width),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(8 * width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--data",
        default=str(example_cache_dir() / "images"),
        help="image folder (created on first run)",
    )
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--n-images", type=int, default=2000)
    p.add_argument("--image-size", type=int, default=96, help="side of the stored JPEGs")
    p.add_argument("--crop", type=int, default=64, help="side of the training crops")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    root = make_image_folder(args.data, args.n_images, args.image_size)
    (train_paths, train_labels), (val_paths, val_labels) = split(*list_images(root), seed=args.seed)
    train_set = ImageFolderDataset(train_paths, train_labels, crop=args.crop, train=True)
    val_set = ImageFolderDataset(val_paths, val_labels, crop=args.crop, train=False)

    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        pin_memory=torch.cuda.is_available(),
        drop_last=True,
    )
    val_loader = DataLoader(
        val_set,
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=args.num_workers,
        pin_memory=torch.cuda.is_available(),
    )

    model = SmallCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()
    print(
        f"{len(train_set)} training / {len(val_set)} validation images, device={device}, "
        # the loader's own figures: under `loadertune run` they are the applied settings
        f"batch_size={train_loader.batch_size}, num_workers={train_loader.num_workers}"
    )

    for epoch in range(1, args.epochs + 1):
        model.train()
        start = time.perf_counter()
        total_loss, correct, seen = 0.0, 0, 0
        for images, labels in train_loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * labels.size(0)
            correct += (outputs.argmax(1) == labels).sum().item()
            seen += labels.size(0)
        elapsed = time.perf_counter() - start

        model.eval()
        val_loss, val_correct, val_seen = 0.0, 0, 0
        with torch.no_grad():
            for images, labels in val_loader:
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                outputs = model(images)
                val_loss += criterion(outputs, labels).item() * labels.size(0)
                val_correct += (outputs.argmax(1) == labels).sum().item()
                val_seen += labels.size(0)

        val_seen = max(val_seen, 1)
        print(
            f"epoch {epoch}/{args.epochs}  "
            f"train loss {total_loss / max(seen, 1):.3f} acc {correct / max(seen, 1):.3f}  "
            f"val loss {val_loss / val_seen:.3f} acc {val_correct / val_seen:.3f}  "
            f"{seen / elapsed:.0f} samples/s ({elapsed:.1f}s)"
        )


if __name__ == "__main__":
    main()
