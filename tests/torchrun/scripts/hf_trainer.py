"""A transformers ``Trainer`` run in the style of the transformers docs' "Fine-tune a model" tutorial: a tiny
BERT built from its config (no hub), a synthetic classification set, ``TrainingArguments`` on the CPU.

torchrun --nproc-per-node 2 hf_trainer.py --max-steps 6 --output-dir out
"""

import argparse

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, set_seed


class Parity(Dataset):
    """Token sequences labelled by the parity of their sum (made here, from a fixed seed)."""

    def __init__(self, n=64, vocab=64, length=12, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)
        self.labels = self.ids.sum(dim=1) % 2

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main(args):
    set_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=4, max_steps=args.max_steps,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=training_args, train_dataset=Parity())
    trainer.train()
    if trainer.is_world_process_zero():
        for entry in trainer.state.log_history:
            if "loss" in entry:
                print(f"step {entry['step']} loss {entry['loss']:.6f}")
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {training_args.process_index} of {training_args.world_size}: checksum {checksum:.6f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--output-dir", default="hf-out")
    main(parser.parse_args())
