"""What torchrun's agent costs an exercise check's launch (why the checks start a learner's script, and their own
harness, with ``course_lib/rankrun.py``, course_lib/teaching/checks/harness.py).

A script like a check's smallest launch (each rank imports torch, joins a gloo group, all-reduces one tensor and
prints it) runs on ``--nproc`` ranks under ``torchrun --standalone`` and under ``rankrun``, interleaved, ``--rounds``
times. It prints the wall seconds of each launch and the CPU seconds of all its processes (launcher and ranks), their
medians with the range, and the ratios round by round.

From the repository root:

  .venv/bin/python benchmarks/launchers.py --rounds 5
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCRIPT = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(value)
print(f"rank {dist.get_rank()}: sum = {value.item():g}")
dist.destroy_process_group()
"""


def measure(launcher: str, script: Path, nproc: int) -> dict:
    """One launch: its wall seconds and the CPU seconds of every process it started."""
    from course_lib.launch import launch_ranks, torchrun

    launch = torchrun if launcher == "torchrun" else launch_ranks
    before, began = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        result = launch(script, nproc=nproc, quiet=True)
    wall, after = time.perf_counter() - began, resource.getrusage(resource.RUSAGE_CHILDREN)
    sums = sorted(float(text.split("sum = ")[1].split()[0]) for text in result.outputs.values())
    assert sums == [nproc * (nproc + 1) / 2] * nproc, f"{launcher}: the ranks printed {result.outputs}"
    return {"wall": wall, "cpu": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"{platform.node()}: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
          f"{args.nproc} ranks per launch, {args.rounds} rounds")
    rows: dict[str, list[dict]] = {"torchrun": [], "rankrun": []}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "all_reduce.py"
        script.write_text(SCRIPT)
        for _ in range(args.rounds):
            for launcher in rows:
                rows[launcher].append(measure(launcher, script, args.nproc))
    for launcher, runs in rows.items():
        print(f"{launcher:8}: wall {summary([r['wall'] for r in runs])}, CPU {summary([r['cpu'] for r in runs])}")
    walls = [t["wall"] / r["wall"] for t, r in zip(rows["torchrun"], rows["rankrun"])]
    cpus = [t["cpu"] / r["cpu"] for t, r in zip(rows["torchrun"], rows["rankrun"])]
    saved = [t["cpu"] - r["cpu"] for t, r in zip(rows["torchrun"], rows["rankrun"])]
    print(f"torchrun / rankrun, round by round: wall {statistics.median(walls):.2f}x ({min(walls):.2f}-{max(walls):.2f}), "
          f"CPU {statistics.median(cpus):.2f}x ({min(cpus):.2f}-{max(cpus):.2f}); "
          f"CPU saved per launch {statistics.median(saved):.2f} s ({min(saved):.2f}-{max(saved):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
