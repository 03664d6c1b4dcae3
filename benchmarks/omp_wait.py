"""What OpenMP's waiting threads cost when another process keeps a core busy (why the test command's parallel pass
sets ``OMP_WAIT_POLICY=PASSIVE``, course_lib/testpasses.py).

A child process trains ``MyModel`` for ``--steps`` SGD steps on a batch of 256 random images with PyTorch's default
intra-op threads (one per core), while ``--busy`` processes spin on the CPU: on a 2-core machine, one busy process is
the other pytest worker. It runs with OpenMP's default wait policy and with ``OMP_WAIT_POLICY=PASSIVE``, interleaved,
``--rounds`` times, and prints the wall and CPU seconds of each, their medians with the range, and the ratios. An idle
machine (no busy process) is measured the same way for comparison.

From the repository root:

  .venv/bin/python benchmarks/omp_wait.py --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, resource, sys, time
import torch
import torch.nn.functional as F
from course_lib import MyModel

torch.manual_seed(0)
model, steps = MyModel(), int(sys.argv[1])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,))


def step():
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


for _ in range(5):
    step()
before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(steps):
    step()
after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - began
cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
print(json.dumps({"wall": wall, "cpu": cpu, "threads": torch.get_num_threads()}))
"""

BUSY = "while True:\n    pass\n"


def measure(steps: int, policy: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run([sys.executable, "-c", CHILD, str(steps)], env=env, capture_output=True, text=True,
                          timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--busy", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="processes spinning on the CPU while the loaded rows run (default: all cores but one)")
    parser.add_argument("--loads", nargs="+", choices=("idle", "loaded"), default=["idle", "loaded"])
    args = parser.parse_args(argv)
    print(f"{platform.node()}: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
          f"{args.steps} steps per run, {args.rounds} rounds, loaded = {args.busy} busy process(es)")
    rows = {}
    for load in args.loads:
        busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy if load == "loaded" else 0)]
        try:
            for _ in range(args.rounds):
                for policy in (None, "PASSIVE"):
                    rows.setdefault((load, policy or "default"), []).append(measure(args.steps, policy))
        finally:
            for process in busy:
                process.kill()
                process.wait()
    for (load, policy), runs in rows.items():
        print(f"{load:6} {policy:8} threads {runs[0]['threads']}: wall {summary([r['wall'] for r in runs])}, "
              f"CPU {summary([r['cpu'] for r in runs])}")
    for load in args.loads:
        default, passive = rows[(load, "default")], rows[(load, "PASSIVE")]
        walls = [d["wall"] / p["wall"] for d, p in zip(default, passive)]
        cpus = [d["cpu"] / p["cpu"] for d, p in zip(default, passive)]
        print(f"{load:6} default / PASSIVE, round by round: wall {statistics.median(walls):.2f}x "
              f"({min(walls):.2f}-{max(walls):.2f}), CPU {statistics.median(cpus):.2f}x ({min(cpus):.2f}-{max(cpus):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
