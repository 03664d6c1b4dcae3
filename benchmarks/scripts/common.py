"""What the three level scripts share: arguments, the model, the data, and how a run is timed.

Each level script trains the same model on the same data with the same per-rank batch; only the
abstraction around the loop changes. Timing starts after ``--warmup`` steps, so process start-up,
imports and the first (slow) iterations are not counted.
"""
import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch

from course_lib import MyModel
from course_lib.data import DEFAULT_ROOT


MODELS = ("mymodel", "resnet18")


def _ints(text: str) -> list[int]:
    return [int(v) for v in str(text).split(",")]


def parse_args(description: str, several: bool = False) -> argparse.Namespace:
    """The shared options; ``several``: --model/--batch/--steps/--warmup take comma-separated lists, one per model."""
    p = argparse.ArgumentParser(description=description)
    if several:
        p.add_argument("--model", default="mymodel", help=f"comma-separated, from {', '.join(MODELS)}")
        p.add_argument("--batch", type=_ints, default=[128], help="per-rank batch size, one per model")
        p.add_argument("--steps", type=_ints, default=[0], help="timed steps, one per model (0: whole epochs)")
        p.add_argument("--warmup", type=_ints, default=[5], help="untimed steps first, one per model")
    else:
        p.add_argument("--model", default="mymodel", choices=MODELS)
        p.add_argument("--batch", type=int, default=128, help="per-rank batch size")
        p.add_argument("--steps", type=int, default=0,
                       help="time this many steps and extrapolate to an epoch (0: time whole epochs)")
        p.add_argument("--warmup", type=int, default=5, help="untimed steps first (with --steps)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--epochs", type=int, default=1, help="epochs to time when --steps is 0")
    p.add_argument("--out", default="", help="JSON file for rank 0's measurements")
    p.add_argument("--data-dir", default=str(DEFAULT_ROOT))
    p.add_argument("--run-dir", default=str(Path(__file__).parent))
    args = p.parse_args()
    if several:
        args.model = args.model.split(",")
        unknown = set(args.model) - set(MODELS)
        if unknown:
            p.error(f"unknown model(s) {sorted(unknown)}; choose from {', '.join(MODELS)}")
        for name in ("batch", "steps", "warmup"):
            values = getattr(args, name)
            if len(values) not in (1, len(args.model)):
                p.error(f"--{name} needs one value or one per model ({len(args.model)})")
            setattr(args, name, values * len(args.model) if len(values) == 1 else values)
    return args


def build_model(name: str) -> torch.nn.Module:
    if name == "resnet18":
        import timm

        # Random weights: nothing is downloaded. in_chans=1 and 10 classes fit MNIST's 28x28 images.
        return timm.create_model("resnet18", pretrained=False, num_classes=10, in_chans=1)
    return MyModel()


def grad_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def local_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def chunk_size(steps: int) -> int:
    """Timed steps are split into about 5 chunks; the fastest chunk is the one least disturbed by other programs."""
    return max(1, steps // 5)


def figures(chunk_step_s: list, steps_per_epoch: int, global_batch: int, extrapolated: bool, steps: int) -> dict:
    """Seconds per step from the chunk timings: the best chunk (headline) and the median one."""
    best, median = min(chunk_step_s), statistics.median(chunk_step_s)
    return {"step_s": best, "step_s_median": median, "epoch_s": best * steps_per_epoch,
            "epoch_s_median": median * steps_per_epoch, "samples_per_s": global_batch / best,
            "steps_timed": steps, "chunks": len(chunk_step_s), "steps_per_epoch": steps_per_epoch,
            "extrapolated": extrapolated}


def time_steps(batches, step, args, steps_per_epoch: int, global_batch: int, device, on_epoch=None) -> dict:
    """Time ``step(x, y)`` over ``batches()`` (an iterable per epoch): fixed steps in chunks, or whole epochs."""
    if args.steps:
        chunk = chunk_size(args.steps)
        done, epoch, chunks, start = 0, 0, [], None
        if args.warmup == 0:
            start = time.perf_counter()
        while True:
            if on_epoch:
                on_epoch(epoch)
            for x, y in batches():
                step(x, y)
                done += 1
                timed = done - args.warmup
                if timed == 0 or (timed > 0 and timed % chunk == 0) or timed == args.steps:
                    sync(device)
                    now = time.perf_counter()
                    if timed > 0 and start is not None:
                        chunks.append((now - start) / (timed - (math.ceil(timed / chunk) - 1) * chunk))
                    start = now
                if timed == args.steps:
                    return figures(chunks, steps_per_epoch, global_batch, True, args.steps)
            epoch += 1
    epoch_times = []
    for epoch in range(args.epochs):
        if on_epoch:
            on_epoch(epoch)
        sync(device)
        start = time.perf_counter()
        count = 0
        for x, y in batches():
            step(x, y)
            count += 1
        sync(device)
        epoch_times.append((time.perf_counter() - start) / count)
    return figures(epoch_times, steps_per_epoch, global_batch, False, steps_per_epoch * args.epochs)


def steps_per_epoch(samples: int, world: int, batch: int) -> int:
    return math.ceil(math.ceil(samples / world) / batch)


def write_result(path: str, record: dict) -> None:
    if not path:
        print(json.dumps(record, indent=1))
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    print(f"measurements written to {path}")
