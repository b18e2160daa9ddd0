"""The Hugging Face Trainer evaluating every 50 steps (``eval_strategy="steps"``), a tiny GPT-2
built from a config (no download), its own arguments read from ``sys.argv`` by hand. Held back
while issue 11 was built; ``run`` named every evaluation's loader (two lines per evaluation)."""

import sys
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2ForSequenceClassification, Trainer, TrainingArguments

from _frameworks import ON_CPU, collate


class Reviews(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 100, (n, 12), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        time.sleep(0.0002)
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones(12, dtype=torch.long),
            "labels": self.labels[i],
        }


def main():
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else tempfile.mkdtemp()
    epochs = int(sys.argv[sys.argv.index("--epochs") + 1]) if "--epochs" in sys.argv else 30
    cfg = GPT2Config(
        vocab_size=100, n_positions=16, n_embd=32, n_layer=1, n_head=2, num_labels=2, pad_token_id=0
    )
    model = GPT2ForSequenceClassification(cfg)
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=40,
        num_train_epochs=epochs,
        eval_strategy="steps",
        eval_steps=50,
        logging_steps=25,
        save_strategy="no",
        report_to="none",
        use_cpu=ON_CPU,
        disable_tqdm=True,
        dataloader_num_workers=0,
        learning_rate=5e-4,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Reviews(1600, 0),
        eval_dataset=Reviews(200, 1),
        data_collator=collate,
    )
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
