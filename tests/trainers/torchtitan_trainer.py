"""torchtitan's Trainer (0.3) adopting the kit in two lines (marked "soak:"), as docs/trainers.md
shows; one rank, or two under torchrun (gloo). ``--attach`` takes the other form: the soak attached
to a trainer built already.

    python tests/trainers/torchtitan_trainer.py --steps 40 --dump-folder titan-out

It is also a config registry for torchtitan's own entry point, as a user's model module is (no line
of the kit in it; the kit's entry point attaches it):

    python -m soak_sidecar_kit.torchtitan --module tests.trainers.torchtitan_trainer \
        --config cpu_debug --training.steps 40 --dump-folder titan-out

torchtitan's Trainer cannot be built without CUDA, so the parts of it that need a GPU are replaced
here, and only those: ``Trainer.__init__`` (it sets a CUDA device, parallelizes the model and measures
GPU memory; here a small CPU model, DDP over gloo on two ranks), ``train_step`` (torchtitan's runs
its CUDA-graph and metrics machinery; here a plain CPU step), the CUDA barrier of
``set_pg_timeouts``, the metrics processor's GPU memory monitor and the validator's dataset (here a
slow validation of ``--validate-s`` seconds at step 1). What runs is torchtitan's own:
``Trainer.Config`` and its component configs and their builds, ``Trainer.train`` (the loop,
``should_continue_training``, its checkpoint and validation calls, the load at the start), the DCP
``CheckpointManager`` (save, load, purge), the optimizer and LR scheduler containers,
``batch_generator`` and ``GarbageCollection``.

Faults for the tests: ``--crash-at N`` raises in step N; ``--hang-at N`` sleeps forever in step N
(rank 0 only).
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch  # type: ignore[import-not-found, unused-ignore]
import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]
from torch.nn.parallel import DistributedDataParallel  # type: ignore[import-not-found, unused-ignore]
from torchtitan.components.checkpoint import CheckpointManager  # type: ignore[import-not-found, unused-ignore]
from torchtitan.components.metrics import MetricsProcessor  # type: ignore[import-not-found, unused-ignore]
from torchtitan.components.optimizer import (  # type: ignore[import-not-found, unused-ignore]
    LRSchedulersContainer,
    default_adamw,
)
from torchtitan.components.validate import Validator  # type: ignore[import-not-found, unused-ignore]
from torchtitan.config import TrainingConfig  # type: ignore[import-not-found, unused-ignore]
from torchtitan.distributed import utils as dist_utils  # type: ignore[import-not-found, unused-ignore]
from torchtitan.tools import utils  # type: ignore[import-not-found, unused-ignore]
from torchtitan.trainer import Trainer  # type: ignore[import-not-found, unused-ignore]

from soak_sidecar_kit import torchtitan as soak_titan  # the other form (--attach)
from soak_sidecar_kit.torchtitan import soak_config  # soak: 1

VOCAB, CONTEXT, WIDTH = 64, 16, 32


class RandomTokens:
    """Tokens made in-process, the same for a position on every run; its position is checkpointed,
    as torchtitan's stateful dataloaders' is."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.position = 0

    def __iter__(self) -> RandomTokens:
        return self

    def __next__(self) -> tuple[dict[str, Any], Any]:
        self.position += 1
        seed = self.position * 1009 + self.rank
        tokens = torch.randint(0, VOCAB, (8, CONTEXT + 1), generator=torch.Generator().manual_seed(seed))
        return {"input": tokens[:, :-1]}, tokens[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class CPUMetrics(MetricsProcessor):  # type: ignore[misc, unused-ignore]
    """torchtitan's MetricsProcessor without its GPU memory monitor and loggers: what the train loop
    and batch generator touch of it, the loss printed."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):  # type: ignore[misc, unused-ignore]
        """Builds the CPU metrics."""

    def __init__(self, config: Any, **kwargs: Any) -> None:
        self.config = config
        self.ntokens_since_last_log = 0
        self.data_loading_times: list[float] = []

    def log(self, step: int, global_avg_loss: float, *args: Any, **kwargs: Any) -> None:
        if step % self.config.log_freq == 0 and dist.get_rank() == 0:
            print(f"step {step} loss {global_avg_loss:.4f}", flush=True)

    def close(self) -> None:
        pass


class SlowValidator(Validator):  # type: ignore[misc, unused-ignore]
    """A validation of ``sleep_s`` seconds and no dataset (torchtitan's downloads one)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):  # type: ignore[misc, unused-ignore]
        sleep_s: float = 0.0

    def __init__(self, config: Any, **kwargs: Any) -> None:
        self.config = config

    def validate(self, model_parts: list[Any], step: int) -> None:
        time.sleep(self.config.sleep_s)


class CPUTrainer(Trainer):  # type: ignore[misc, unused-ignore]
    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):  # type: ignore[misc, unused-ignore]
        """torchtitan builds a Config's owner: this one builds the CPU trainer."""

    def __init__(self, config: Any) -> None:  # torchtitan's needs CUDA: see the module's docstring
        init_process_group()
        dist_utils.set_pg_timeouts = cpu_pg_timeouts
        self.config = config
        self.device = torch.device("cpu")
        self.parallel_dims = None
        self.gc_handler = utils.GarbageCollection(gc_freq=config.training.gc_freq)
        model: Any = torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH), torch.nn.Linear(WIDTH, VOCAB))
        if dist.get_world_size() > 1:
            model = DistributedDataParallel(model)
        self.model_parts = [model]
        self.optimizers = config.optimizer.build(model_parts=self.model_parts)
        self.lr_schedulers = config.lr_scheduler.build(
            optimizers=self.optimizers, training_steps=config.training.steps
        )
        self.metrics_processor = config.metrics.build()
        self.step = 0
        self.ntokens_seen = 0
        self.dataloader = RandomTokens(dist.get_rank())
        self.checkpointer = config.checkpoint.build(
            dataloader=self.dataloader,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self},
            sd_adapter=None,
            base_folder=config.dump_folder,
        )
        if config.validator.enable:
            self.validator = config.validator.build()
        self.faults: argparse.Namespace = argparse.Namespace(crash_at=0, hang_at=0, step_s=0.05)

    def train_step(self, data_iterator: Any) -> None:
        if self.step == self.faults.crash_at:
            raise RuntimeError(f"crash requested at step {self.step}")
        if self.step == self.faults.hang_at and dist.get_rank() == 0:
            while True:
                time.sleep(1)  # the hung line
        inputs, labels = next(data_iterator)
        self.ntokens_seen += labels.numel()
        self.optimizers.zero_grad()
        logits = self.model_parts[0](inputs["input"])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        loss.backward()
        self.optimizers.step()
        self.lr_schedulers.step()
        self.metrics_processor.log(self.step, float(loss.detach()))
        time.sleep(self.faults.step_s)


def cpu_pg_timeouts(timeout: timedelta, parallel_dims: Any) -> None:
    """set_pg_timeouts without its CUDA barrier."""
    dist.barrier()
    dist.set_timeout(timeout)


def init_process_group() -> None:
    if dist.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ:  # one rank, not under torchrun
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")


def cpu_debug(
    steps: int = 40, checkpoint_interval: int = 1000, dump_folder: str = "titan-out", validate_s: float = 0.0
) -> Any:
    """The config: torchtitan's own component configs, the CPU trainer as their owner."""
    return CPUTrainer.Config(
        dump_folder=dump_folder,
        metrics=CPUMetrics.Config(),
        validator=SlowValidator.Config(enable=validate_s > 0, freq=10**9, sleep_s=validate_s),  # at step 1
        optimizer=default_adamw(lr=1e-3),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=2),
        training=TrainingConfig(steps=steps),
        checkpoint=CheckpointManager.Config(enable=True, interval=checkpoint_interval),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--checkpoint-interval", type=int, default=1000)
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--hang-at", type=int, default=0)
    parser.add_argument("--validate-s", type=float, default=0.0)
    parser.add_argument("--dump-folder", default="titan-out")
    parser.add_argument("--attach", action="store_true")
    args = parser.parse_args()
    config = cpu_debug(args.steps, args.checkpoint_interval, args.dump_folder, args.validate_s)
    if args.attach:
        trainer = config.build()
        soak_titan.attach(trainer)
    else:
        trainer = soak_config(config).build()  # soak: 2
    trainer.faults = args
    try:
        trainer.train()
    finally:
        trainer.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
