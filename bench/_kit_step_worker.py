"""One rank of bench/kit_step_cost.py (run under torchrun, gloo): the same steps bare, with the kit,
and with a stop collective every step (the kit before issue 53), interleaved by rounds. Rank 0
prints one JSON line of seconds per step, each segment's median over the rounds."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from soak_sidecar_kit import Soak


def spin(seconds: float) -> None:
    """A step of fixed length: the CPU busy, as a compute step keeps it."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def per_step_collective() -> bool:
    """What the kit asked every step before: a MAX all-reduce of the stop flag and its host read."""
    flag = torch.tensor([0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def segment(steps: int, step_s: float, ask: Callable[[int], object]) -> float:
    dist.barrier()
    started = time.perf_counter()
    for step in range(steps):
        ask(step)
        spin(step_s)
    dist.barrier()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-ms", type=float, nargs="+", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    with tempfile.TemporaryDirectory() as progress:
        environ = {**os.environ, "SOAK_PROGRESS_DIR": progress}
        soak = Soak(environ=environ, handle_signal=False)

        def with_kit(step: int) -> None:
            soak.should_stop()
            soak.progress(step, samples=step * 32, loss=1.0)

        results = {}
        for step_ms in args.step_ms:
            kinds: dict[str, Callable[[int], object]] = {
                "bare": lambda _step: None,
                "kit": with_kit,
                "collective_per_step": lambda _step: per_step_collective(),
            }
            seconds: dict[str, list[float]] = {name: [] for name in kinds}
            for _round in range(args.rounds):
                for name, ask in kinds.items():
                    seconds[name].append(segment(args.steps, step_ms / 1000, ask))
            results[str(step_ms)] = {name: statistics.median(values) for name, values in seconds.items()}
    if dist.get_rank() == 0:
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
