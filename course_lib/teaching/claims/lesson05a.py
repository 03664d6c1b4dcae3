"""What lesson 05's first part (05a_accelerate_port) says about its run, checked from its artifacts (see
course_lib.teaching.verify).

The launches stream every rank's lines into their cells, so what the processes printed (their rank and world size,
the distributed type) is read from the cells' text; what they logged is read from each run's metrics.jsonl.
"""
from __future__ import annotations

import math
import re

RUN = "runs/05_accelerate"


def launch_facts(run, plan_cell: str) -> tuple[int, str, int]:
    """(processes, the DistributedType they should report, batches per process per epoch), from the part's
    parameters and the cell that printed its launch plan (CPU or GPUs)."""
    p = run.parameters
    nproc, batch = p["NPROC"], p["BATCH_SIZE"]
    cpu = f"{nproc} training processes on CPU" in run.cell_text(plan_cell)
    return nproc, f"DistributedType.{'MULTI_CPU' if cpu else 'MULTI_GPU'}", math.ceil(math.ceil(60000 / batch) / nproc)


def check(run) -> None:
    p = run.parameters
    nproc, kind, per_process = launch_facts(run, "f1aac842")
    _seed_snippet(run)
    _launches(run, p, nproc, kind, per_process)
    _tools(run, nproc, kind)
    _panel(run, p, nproc)


def _seed_snippet(run) -> None:
    run.claim("NameError: name 'scheduler' is not defined" in run.cell_text("a872669a"),
              "the seed's snippet, run as written, stops with a NameError on `scheduler`")
    run.claim("NameError: name 'inputs' is not defined" in run.cell_text("c84a8a27"),
              "with a scheduler created, the seed's loop stops with a NameError on `inputs`")
    losses = run.found(r"loss ([\d.]+) -> ([\d.]+)", run.cell_text("e099dbf7"), required=False)
    run.claim(losses is not None and float(losses[1]) < float(losses[0]),
              f"the fixed snippet trains: its loss went down ({losses})")


def _launches(run, p, nproc, kind, per_process) -> None:
    ddp = run.events(f"{RUN}/ddp")
    run.claim(len(ddp) == p["EPOCHS"] and all(r["val_count"] == 10_000 for r in ddp),
              f"lesson 02's script under torchrun trained {p['EPOCHS']} epoch(s), counting 10,000 images each")
    printed = run.cell_text("a1719782")
    ranks = {int(r): (int(n), int(b)) for r, n, b in
             re.findall(r"rank (\d+)/(\d+): \d+ training samples, (\d+) steps per epoch", printed)}
    run.claim(sorted(ranks) == list(range(nproc)) and all(n == nproc for n, _ in ranks.values()),
              f"under accelerate launch each of the {nproc} processes knew it was one of {nproc} ({ranks})")
    run.claim({b for _, b in ranks.values()} == {per_process},
              f"each process's prepared loader held 1/{nproc} of the batches, {per_process} ({ranks})")
    run.claim(f"{kind}, {nproc} process(es), mixed precision no" in printed,
              f"the port said {kind} with {nproc} processes and no mixed precision")
    rows = {r["run"]: r for r in run.table("s / epoch")}
    acc = rows.get("Accelerate, accelerate launch", {})
    run.claim(acc.get("epochs") == p["EPOCHS"] and acc.get("val_count") == 10_000
              and len(re.findall(r"\(10000 samples\)", printed)) == p["EPOCHS"],
              f"the port trained {p['EPOCHS']} epoch(s) and evaluated all 10,000 images after each")


def _tools(run, nproc, kind) -> None:
    versions = run.found(r"torch (\S+), accelerate (\S+);", run.cell_text("8f596a83"), required=False)
    env = run.cell_text("61aee9da")
    run.claim(versions is not None and f"`Accelerate` version: {versions[1]}" in env
              and f"PyTorch version: {versions[0]}" in env,
              f"`accelerate env` reports the versions this kernel imported ({versions})")
    run.claim("exit code 0, Test is a success!" in run.cell_text("bde27a32"), "`accelerate test` succeeded")
    refused = run.cell_text("6b9256b9")
    run.claim("ValueError:" in refused and "should only be initialized inside your training function" in refused,
              "with an Accelerator already in the kernel, notebook_launcher refuses with Accelerate's own message")
    forked = run.titled("What each forked process saw", required=False)
    if forked is None:
        run.claim("already used CUDA" in run.cell_text("01391114"),
                  "notebook_launcher either ran or the lesson said why not (CUDA used in the kernel)")
        return
    records = forked["rows"]
    run.claim([r["process"] for r in records] == list(range(nproc)) and {r["of"] for r in records} == {nproc},
              f"notebook_launcher started processes 0..{nproc - 1}, each one of {nproc}")
    run.claim(sum(r["images"] for r in records) == 4096, "the forked processes' shares cover the 4,096 images once")
    kernel = run.found(r"forked from this kernel \(pid (\d+)\)", run.cell_text("01391114"), required=False)
    pids = {r["pid"] for r in records}
    run.claim(kernel is not None and len(pids) == nproc and int(kernel[0]) not in pids,
              "each forked function ran in a process of its own, not in the kernel")
    run.claim({r["distributed type"] for r in records} == {kind}, f"the forked processes formed one {kind} group")


def _panel(run, p, nproc) -> None:
    ready = (f"Ready: accelerate launch of {RUN}/train.py on {nproc} processes, arguments --batch-size "
             f"{p['BATCH_SIZE']} --lr {p['LR']} --epochs 1, mixed precision no.")
    run.claim(ready in run.cell_text("1293d07d"), "the launch panel is set to section 4's launch")
