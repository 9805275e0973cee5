"""A tiny Hugging Face Trainer adopting the kit in two lines (marked "soak:"), as docs/trainers.md
shows: GPT-2 built from a small GPT2Config, random tokens made in two DataLoader workers, CPU; one
rank, or two under torchrun (DDP over gloo).

    python tests/trainers/hf_trainer.py --max-steps 40 --output-dir hf-out

Faults for the tests: ``--crash-at N`` raises in step N; ``--hang-at N`` sleeps forever in step N
(rank 0 only).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch  # type: ignore[import-not-found, unused-ignore]
from torch.utils.data import Dataset  # type: ignore[import-not-found, unused-ignore]
from transformers import (  # type: ignore[import-not-found, unused-ignore]
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from soak_sidecar_kit.hf import train  # soak: 1

VOCAB, CONTEXT = 64, 16


class RandomTokens(Dataset):  # type: ignore[misc, unused-ignore]
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> dict[str, Any]:
        tokens = torch.randint(0, VOCAB, (CONTEXT,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": tokens, "labels": tokens}


class Faults(TrainerCallback):  # type: ignore[misc, unused-ignore]
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = state.global_step + 1
        if step == self.args.crash_at:
            raise RuntimeError(f"crash requested at step {step}")
        if step == self.args.hang_at and state.is_world_process_zero:
            while True:
                time.sleep(1)  # the hung line
        time.sleep(self.args.step_s)
        return control


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--hang-at", type=int, default=0)
    parser.add_argument("--output-dir", default=os.environ.get("TRAINER_OUTPUT_DIR", "hf-out"))
    args = parser.parse_args()
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=1, n_head=2)
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=8,
        dataloader_num_workers=2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config), args=training, train_dataset=RandomTokens(), callbacks=[Faults(args)]
    )
    train(trainer)  # soak: 2 (instead of trainer.train())
    if trainer.is_world_process_zero():
        print(f"trained to step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
