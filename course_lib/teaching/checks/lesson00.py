"""Checks of lesson 00 (setup): a rank's print, the backend rule, a first all_reduce."""
from __future__ import annotations

import re

from .harness import Report, call, launch_script, rank_outputs


def check_hello_ranks(script, nproc: int = 2) -> None:
    """Task 00.1: every rank prints ``rank R of W`` with its own rank and the world size."""
    report = Report("00.1", f"each of {nproc} processes prints `rank R of {nproc}`")
    outputs = rank_outputs(launch_script("00.1", script, nproc=nproc))
    pattern = re.compile(r"\brank (\d+) of (\d+)\b")
    for rank in range(nproc):
        said = pattern.findall(outputs.get(rank, ""))
        if not said:
            report.fail(f"rank {rank} printed no line like `rank {rank} of {nproc}`",
                        "torchrun gives every process its rank and the world size in environment variables.")
        elif (str(rank), str(nproc)) in said:
            report.ok(f"rank {rank} printed `rank {rank} of {nproc}`")
        else:
            r, w = said[0]
            report.fail(f"rank {rank} printed `rank {r} of {w}`; it should say `rank {rank} of {nproc}`",
                        "Read the values torchrun set for this process (not a constant, not LOCAL_RANK only).")
    report.done()


def check_pick_backend(pick_backend) -> None:
    """Task 00.2: nccl only when CUDA works and every local rank has its own GPU, else gloo."""
    report = Report("00.2", "pick_backend(cuda_available, gpu_count, local_world_size)")
    cases = [
        ((False, 0, 2), "gloo", "a laptop without GPUs"),
        ((True, 4, 4), "nccl", "4 GPUs for 4 local processes"),
        ((True, 8, 2), "nccl", "8 GPUs for 2 local processes"),
        ((True, 1, 2), "gloo", "1 GPU for 2 local processes (NCCL would need one GPU per rank)"),
        ((False, 2, 2), "gloo", "a CUDA build that cannot use its GPUs (cuda_available=False)"),
    ]
    for args, expected, story in cases:
        got = call("00.2", pick_backend, *args)
        report.expect(got == expected, f"{story}: {got!r}",
                      f"{story}: returned {got!r}, expected {expected!r}",
                      "nccl needs CUDA *and* one GPU per local rank; everything else runs on gloo.")
    report.done()


def check_all_reduce_script(script, nproc: int = 2) -> None:
    """Task 00.3: each rank joins the group, all-reduces ``rank + 1`` and prints the sum."""
    report = Report("00.3", f"all_reduce of rank + 1 over {nproc} processes")
    outputs = rank_outputs(launch_script("00.3", script, nproc=nproc))
    expected = nproc * (nproc + 1) // 2
    pattern = re.compile(r"\bsum = (-?\d+(?:\.\d+)?)")
    for rank in range(nproc):
        said = pattern.findall(outputs.get(rank, ""))
        if not said:
            report.fail(f"rank {rank} printed no `sum = ...` line",
                        "Print the tensor's value after the all_reduce, e.g. `sum = 3`.")
            continue
        value = float(said[-1])
        if value == expected:
            report.ok(f"rank {rank} got sum = {expected:g}")
        elif value == rank + 1:
            report.fail(f"rank {rank} printed its own value {value:g}, not the sum {expected}",
                        "all_reduce changes the tensor in place on every rank; print it after the call.")
        else:
            report.fail(f"rank {rank} printed sum = {value:g}, expected {expected}",
                        "Each rank contributes rank + 1; the default reduction is a sum.")
    backends = [m for r in range(nproc) for m in re.findall(r"backend[ =:]+(\w+)", outputs.get(r, ""))]
    report.expect(bool(backends) and set(backends) <= {"gloo", "nccl"},
                  f"the backend was printed: {sorted(set(backends))}",
                  "no rank printed `backend = gloo` (or nccl)",
                  "Print dist.get_backend() after init_process_group, so the reader knows which was used.")
    report.done()
