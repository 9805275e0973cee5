"""A tiny Hugging Face Trainer script as a user writes it, adopting the kit in three lines (marked
"soak:"), as docs/trainers.md shows: GPT-2 built from a small GPT2Config, random tokens made in two
DataLoader workers, CPU; one rank, or two under torchrun (DDP over gloo). It evaluates and saves
every ``--every`` steps (``eval_strategy``/``save_strategy="steps"``, ``save_total_limit=2``), with
metrics of its own (``compute_metrics``) and a callback of its own.

    python tests/trainers/hf_trainer.py --max-steps 40 --output-dir hf-out

Faults for the tests: ``--crash-at N`` raises in step N; ``--hang-at N`` sleeps forever in step N;
``--eval-s S`` and ``--save-s S`` make the first evaluation and the first save last S seconds more
(``compute_metrics``, the callback's ``on_save``), ``--hang-in eval|save`` makes them last forever
(the hangs on rank 0 only).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Any

import torch  # type: ignore[import-not-found, unused-ignore]
from torch.utils.data import Dataset  # type: ignore[import-not-found, unused-ignore]
from transformers import (  # type: ignore[import-not-found, unused-ignore]
    EvalPrediction,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from soak_sidecar_kit.hf import output_dir, train  # soak: 1

VOCAB, CONTEXT = 64, 16


class RandomTokens(Dataset):  # type: ignore[misc, unused-ignore]
    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed = size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(self.seed + index)
        tokens = torch.randint(0, VOCAB, (CONTEXT,), generator=generator)
        return {"input_ids": tokens, "labels": tokens}


def hang_here() -> None:
    while True:
        time.sleep(1)  # the hung line


class Faults(TrainerCallback):  # type: ignore[misc, unused-ignore]
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.saved = False

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = state.global_step + 1
        if step == self.args.crash_at:
            raise RuntimeError(f"crash requested at step {step}")
        if step == self.args.hang_at and state.is_world_process_zero:
            hang_here()
        time.sleep(self.args.step_s)
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        first, self.saved = not self.saved, True
        if first and self.args.hang_in == "save" and state.is_world_process_zero:
            hang_here()
        if first:
            time.sleep(self.args.save_s)  # a slow save: the user's own upload, say
        return control


class Metrics:
    """compute_metrics: the perplexity of the evaluation set."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.evaluated = False

    def __call__(self, prediction: EvalPrediction) -> dict[str, float]:
        first, self.evaluated = not self.evaluated, True
        if first and self.args.hang_in == "eval" and int(os.environ.get("RANK", "0")) == 0:
            hang_here()
        if first:
            time.sleep(self.args.eval_s)
        logits = torch.as_tensor(prediction.predictions)[:, :-1].reshape(-1, VOCAB)
        labels = torch.as_tensor(prediction.label_ids)[:, 1:].reshape(-1)
        return {"perplexity": math.exp(float(torch.nn.functional.cross_entropy(logits, labels)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="evaluate and save every N steps")
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--eval-s", type=float, default=0.0)
    parser.add_argument("--save-s", type=float, default=0.0)
    parser.add_argument("--hang-in", choices=("eval", "save"))
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--hang-at", type=int, default=0)
    parser.add_argument("--output-dir", default=os.environ.get("TRAINER_OUTPUT_DIR", "hf-out"))
    args = parser.parse_args()
    out = args.output_dir
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=1, n_head=2)
    training = TrainingArguments(
        output_dir=output_dir(out),  # soak: 2 (the soak's folder when it names one)
        max_steps=args.max_steps,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        dataloader_num_workers=2,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=args.every,
        save_strategy="steps",
        save_steps=args.every,
        save_total_limit=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        log_level="info",
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=RandomTokens(1 << 20),
        eval_dataset=RandomTokens(16, seed=1 << 21),
        compute_metrics=Metrics(args),
        callbacks=[Faults(args)],
    )
    train(trainer)  # soak: 3 (instead of trainer.train())
    if trainer.is_world_process_zero():
        print(f"trained to step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
