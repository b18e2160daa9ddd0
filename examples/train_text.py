"""Train a bag-of-embeddings text classifier (a plain PyTorch script, runnable on a CPU).

The first run writes a synthetic corpus: ``--n-lines`` short sentences of made-up words, one per
line, labelled by a keyword rule (4 classes, each with its own keywords; a sentence belongs to the
class whose keywords it mentions most). Later runs reuse it. The Dataset tokenizes each line when
it is loaded (lowercase, regex split, vocabulary lookup, hashed bigrams) and returns a variable
length tensor of token ids; ``collate_fn`` pads each batch to its longest sentence.

Run it as is::

    python examples/train_text.py --epochs 1
    python examples/train_text.py --epochs 3 --num-workers 2 --batch-size 128

Let loadertune find the fastest DataLoader settings for it, unmodified::

    loadertune search examples/train_text.py -- --epochs 1

The corpus lives in ``~/.cache/loadertune-examples/text`` (``$LOADERTUNE_EXAMPLE_DATA/text``
when that variable is set), or wherever ``--data`` says.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

N_CLASSES = 4
KEYWORDS_PER_CLASS = 8
PAD, UNK = 0, 1
TOKEN_RE = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+|[^\s\w]")


def example_cache_dir() -> Path:
    """Where the examples keep their generated data (``$LOADERTUNE_EXAMPLE_DATA`` overrides)."""
    root = os.environ.get("LOADERTUNE_EXAMPLE_DATA") or "~/.cache/loadertune-examples"
    return Path(root).expanduser()


# ---------------------------------------------------------------------------------------------
# Synthetic corpus
# ---------------------------------------------------------------------------------------------


def _make_words(rng: random.Random, n: int) -> list[str]:
    onsets = [
        "b",
        "br",
        "d",
        "dr",
        "f",
        "g",
        "gl",
        "k",
        "kr",
        "l",
        "m",
        "n",
        "p",
        "pl",
        "r",
        "s",
        "st",
        "t",
        "tr",
        "v",
        "z",
        "sh",
        "th",
        "ch",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ee"]
    codas = ["", "", "n", "r", "s", "l", "m", "x", "nd", "st"]
    words: set[str] = set()
    while len(words) < n:
        syllables = rng.choice((1, 2, 2, 2, 3, 3, 4))
        words.add(
            "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(syllables))
            + rng.choice(codas)
        )
    ordered = sorted(words)
    rng.shuffle(ordered)
    return ordered


def keyword_label(tokens: list[str], keywords: dict[str, int]) -> int:
    """The class whose keywords occur most often; ties go to the one mentioned first."""
    counts = [0] * N_CLASSES
    first = [len(tokens)] * N_CLASSES
    for pos, tok in enumerate(tokens):
        c = keywords.get(tok)
        if c is not None:
            counts[c] += 1
            first[c] = min(first[c], pos)
    return max(range(N_CLASSES), key=lambda c: (counts[c], -first[c]))


def make_corpus(
    root: str | os.PathLike[str],
    n_lines: int,
    seed: int = 0,
    mean_words: int = 14,
    max_words: int = 60,
    verbose: bool = True,
) -> Path:
    """Write a corpus of ``label<TAB>sentence`` lines under ``root``, once; return its path.

    Lines have ``4 + Exp(mean_words)`` words (at most ``max_words``), plus keywords.
    Deterministic for given arguments; an existing file is reused.
    """
    root = Path(root).expanduser()
    path = root / f"corpus_{n_lines}_s{seed}_w{mean_words}-{max_words}.tsv"
    if path.exists():
        return path
    start = time.perf_counter()
    rng = random.Random(seed)
    words = _make_words(rng, 3000)
    keywords = words[: N_CLASSES * KEYWORDS_PER_CLASS]
    filler = words[N_CLASSES * KEYWORDS_PER_CLASS :]
    # Zipf-like word frequencies, so the vocabulary has a long tail of rare words.
    cum_weights = list(itertools.accumulate(1.0 / (rank + 10) for rank in range(len(filler))))
    kw_class = {w: i // KEYWORDS_PER_CLASS for i, w in enumerate(keywords)}
    lines = []
    for _ in range(n_lines):
        length = min(max_words, 4 + int(rng.expovariate(1 / mean_words)))
        tokens = rng.choices(filler, cum_weights=cum_weights, k=length)
        target = rng.randrange(N_CLASSES)
        mine = keywords[target * KEYWORDS_PER_CLASS : (target + 1) * KEYWORDS_PER_CLASS]
        for _ in range(rng.choice((1, 1, 2, 3))):
            tokens.insert(rng.randrange(len(tokens) + 1), rng.choice(mine))
        if rng.random() < 0.4:  # a distractor from another class
            tokens.insert(rng.randrange(len(tokens) + 1), rng.choice(keywords))
        label = keyword_label(tokens, kw_class)
        # Surface noise the tokenizer has to undo: capitals, numbers, punctuation.
        out = []
        for i, tok in enumerate(tokens):
            if i == 0 or rng.random() < 0.05:
                tok = tok.capitalize()
            if rng.random() < 0.03:
                tok = f"{tok} {rng.randrange(1, 2000)}"
            if rng.random() < 0.08:
                tok += rng.choice(",;:")
            out.append(tok)
        lines.append(f"{label}\t{' '.join(out)}{rng.choice('.!?')}\n")
    root.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(lines))
    os.replace(tmp, path)
    if verbose:
        print(f"wrote {n_lines} lines to {path} in {time.perf_counter() - start:.1f}s")
    return path


# ---------------------------------------------------------------------------------------------
# Dataset (tokenizes on the fly) and the padding collate function
# ---------------------------------------------------------------------------------------------


def tokenize(text: str) -> list[str]:
    return TOKEN_RE.findall(text.lower())


def build_vocab(texts: list[str], min_count: int = 2) -> dict[str, int]:
    counts = Counter(tok for text in texts for tok in tokenize(text))
    vocab = {"<pad>": PAD, "<unk>": UNK}
    for tok, n in counts.most_common():
        if n >= min_count:
            vocab[tok] = len(vocab)
    return vocab


class TextDataset(Dataset):
    """Lines of a ``label<TAB>text`` file; ``__getitem__`` returns (token ids, label).

    The ids are the words' vocabulary entries followed by hashed bigrams (fastText style), in
    ``[len(vocab), len(vocab) + n_buckets)``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        vocab: dict[str, int] | None = None,
        n_buckets: int = 1 << 14,
        indices: np.ndarray | None = None,
    ) -> None:
        with open(path, encoding="utf-8") as f:
            rows = [line.rstrip("\n").split("\t", 1) for line in f]
        if indices is not None:
            rows = [rows[i] for i in indices]
        self.texts = [text for _, text in rows]
        self.labels = np.array([int(label) for label, _ in rows], dtype=np.int64)
        self.vocab = vocab if vocab is not None else build_vocab(self.texts)
        self.n_buckets = n_buckets

    @property
    def n_ids(self) -> int:
        return len(self.vocab) + self.n_buckets

    def __len__(self) -> int:
        return len(self.texts)

    def encode(self, text: str) -> list[int]:
        tokens = tokenize(text)
        ids = [self.vocab.get(tok, UNK) for tok in tokens]
        base = len(self.vocab)
        ids += [
            base + zlib.crc32(f"{a} {b}".encode()) % self.n_buckets
            for a, b in itertools.pairwise(tokens)
        ]
        return ids

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        ids = torch.tensor(self.encode(self.texts[index]), dtype=torch.long)
        return ids, int(self.labels[index])


def collate_fn(batch: list[tuple[torch.Tensor, int]]):
    """Pad to the longest sequence of the batch: (padded ids, lengths, labels)."""
    seqs, labels = zip(*batch, strict=True)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    padded = pad_sequence(list(seqs), batch_first=True, padding_value=PAD)
    return padded, lengths, torch.tensor(labels, dtype=torch.long)


# ---------------------------------------------------------------------------------------------
# Model and training loop
# ---------------------------------------------------------------------------------------------


class BagOfEmbeddings(nn.Module):
    """Mean of the token embeddings (padding masked out), then a small MLP."""

    def __init__(self, n_ids: int, dim: int = 64, n_classes: int = N_CLASSES) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_ids, dim, padding_idx=PAD)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, n_classes))

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        summed = self.embedding(ids).sum(1)  # the padding embedding is zero
        return self.head(summed / lengths.clamp(min=1).unsqueeze(1).to(summed.dtype))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--data",
        default=str(example_cache_dir() / "text"),
        help="folder of the corpus (created on first run)",
    )
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--n-lines", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    corpus = make_corpus(args.data, args.n_lines)
    order = np.random.default_rng(args.seed).permutation(args.n_lines)
    n_val = args.n_lines // 10
    train_set = TextDataset(corpus, indices=order[n_val:])
    val_set = TextDataset(corpus, vocab=train_set.vocab, indices=order[:n_val])

    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        collate_fn=collate_fn,
        pin_memory=torch.cuda.is_available(),
        drop_last=True,
    )
    val_loader = DataLoader(
        val_set,
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=args.num_workers,
        collate_fn=collate_fn,
        pin_memory=torch.cuda.is_available(),
    )

    model = BagOfEmbeddings(train_set.n_ids).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()
    print(
        f"{len(train_set)} training / {len(val_set)} validation lines, "
        f"vocabulary {len(train_set.vocab)} words, device={device}, "
        f"batch_size={args.batch_size}, num_workers={args.num_workers}"
    )

    for epoch in range(1, args.epochs + 1):
        model.train()
        start = time.perf_counter()
        total_loss, correct, seen = 0.0, 0, 0
        for ids, lengths, labels in train_loader:
            ids = ids.to(device, non_blocking=True)
            lengths = lengths.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            outputs = model(ids, lengths)
            loss = criterion(outputs, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * labels.size(0)
            correct += (outputs.argmax(1) == labels).sum().item()
            seen += labels.size(0)
        elapsed = time.perf_counter() - start

        model.eval()
        val_correct, val_seen = 0, 0
        with torch.no_grad():
            for ids, lengths, labels in val_loader:
                ids = ids.to(device, non_blocking=True)
                outputs = model(ids, lengths.to(device, non_blocking=True))
                val_correct += (outputs.argmax(1).cpu() == labels).sum().item()
                val_seen += labels.size(0)

        print(
            f"epoch {epoch}/{args.epochs}  "
            f"train loss {total_loss / max(seen, 1):.3f} acc {correct / max(seen, 1):.3f}  "
            f"val acc {val_correct / max(val_seen, 1):.3f}  "
            f"{seen / elapsed:.0f} samples/s ({elapsed:.1f}s)"
        )


if __name__ == "__main__":
    main()
