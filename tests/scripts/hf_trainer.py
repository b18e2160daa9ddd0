"""The Hugging Face Trainer on a tiny BERT built from a config (no download), on the CPU."""

import argparse
import tempfile

from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from _frameworks import ON_CPU, Tokens, collate

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=50)
parser.add_argument("--output-dir", default=None)
options = parser.parse_args()
config = BertConfig(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
    num_labels=2,
)
args = TrainingArguments(
    output_dir=options.output_dir or tempfile.mkdtemp(prefix="hf-trainer-"),
    per_device_train_batch_size=16,
    per_device_eval_batch_size=20,
    num_train_epochs=options.epochs,
    eval_strategy="epoch",
    save_strategy="no",
    logging_strategy="no",
    report_to=[],
    use_cpu=ON_CPU,
    disable_tqdm=True,
)
trainer = Trainer(
    model=BertForSequenceClassification(config),
    args=args,
    train_dataset=Tokens(),
    eval_dataset=Tokens(n=200),
    data_collator=collate,
)
trainer.train()
