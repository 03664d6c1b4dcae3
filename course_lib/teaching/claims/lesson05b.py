"""What lesson 05's second part (05b_accelerate_trap_and_evaluation) says about its run, checked from its artifacts
(see course_lib.teaching.verify).

The part trains the port into runs/05_accelerate/trained and resumes it there, so that folder's metrics.jsonl is the
resume's: the training run's epochs are read from what its cell printed. The facts about Accelerate's loaders that
do not depend on the run (the seedable sampler) are tested in tests/test_verify_lesson05.py.
"""
from __future__ import annotations

import math
import re

RUN = "runs/05_accelerate"


def check(run) -> None:
    p = run.parameters
    nproc, batch = p["NPROC"], p["BATCH_SIZE"]
    layout = run.cell_text("e05b1a70")
    cpu, eval_cpu = (f"{nproc} training processes on CPU" in layout, f"{p['EVAL_NPROC']} evaluation processes on CPU"
                     in layout)
    kind = f"DistributedType.{'MULTI_CPU' if cpu else 'MULTI_GPU'}"
    _training(run, p, nproc, kind)
    _pitfall_and_evaluation(run, p, nproc, batch, cpu and eval_cpu)
    _resume(run, p, nproc, kind)
    _mid_epoch(run)


def _training(run, p, nproc, kind) -> None:
    printed = run.cell_text("e05b7a11")
    run.claim(f"{kind}, {nproc} process(es), mixed precision no" in printed
              and len(re.findall(r"\(10000 samples\)", printed)) == p["EPOCHS"],
              f"the part's own training run was {kind} on {nproc} processes and evaluated all 10,000 images after "
              f"each of its {p['EPOCHS']} epoch(s)")


def _pitfall_and_evaluation(run, p, nproc, batch, cpu) -> None:
    shown = run.cell_text("26eb988f")
    records = run.events(f"{RUN}/pitfall", "eval")
    if "No GPU here" in shown:
        run.claim(len(records) == nproc, f"without a CPU request, each of the {nproc} processes logged as rank 0")
        run.claim(all(r["world_size"] == 1 and r["distributed_type"] == "DistributedType.NO" for r in records),
                  "without a CPU request, every process believed it was alone (world_size 1, DistributedType.NO)")
        run.claim(all(r["train_batches"] == [math.ceil(60000 / batch)] for r in records),
                  "without a CPU request, every process's training loader held all the batches")
    elif "A GPU per process here" in shown:
        run.claim(len(records) == 1 and records[0]["world_size"] == nproc,
                  "with a GPU per process, the same command is one correct launch")
    evaluated = run.events(f"{RUN}/eval", "eval")
    run.claim(len(evaluated) == 1 and evaluated[0]["world_size"] == p["EVAL_NPROC"]
              and evaluated[0]["val_count"] == 10_000,
              f"at {p['EVAL_NPROC']} processes gather_for_metrics kept exactly 10,000 images")

    import torch

    checkpoint = run.folder / RUN / "trained" / "checkpoints" / f"checkpoint-{p['EPOCHS'] - 1}.pt"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    run.claim(sorted(saved) == ["epoch", "model", "optimizer"] and saved["epoch"] == p["EPOCHS"] - 1,
              "the training run's checkpoint holds the model, the optimizer and its epoch, and loads weights_only")
    run.claim(not any(k.startswith("module.") for k in saved["model"]),
              "the checkpoint holds the unwrapped model (no `module.` keys)")
    counts = run.found(r"single process: (\d+) / 10000 correct; \d+ processes during training: (\d+); "
                       r"\d+ processes: (\d+)", run.cell_text("593a6e5c"), required=False)
    # On GPUs the processes' kernels round differently from a CPU evaluation: a few borderline images.
    tolerance = 0 if cpu else 5
    one, training, three = (int(c) for c in counts) if counts else (None, None, None)
    run.claim(counts is not None and abs(one - training) <= tolerance and abs(three - training) <= tolerance,
              f"one process, the training processes and the evaluation processes count the same correct "
              f"answers ({counts})")
    again = run.scored(checkpoint, batch=256)[1]
    run.claim(again == one, f"the checkpoint, scored again from the file, gets the printed {one} ({again})")


def _resume(run, p, nproc, kind) -> None:
    run.claim(f"starting at epoch {p['EPOCHS']}" in run.cell_text("b743bece"),
              f"the resumed run said it starts at epoch {p['EPOCHS']}")
    resumed = run.events(f"{RUN}/trained")
    run.claim([r["epoch"] for r in resumed] == [p["EPOCHS"]] and all(
        r["world_size"] == nproc and r["distributed_type"] == kind and r["val_count"] == 10_000 for r in resumed),
        f"the resume under torchrun trained epoch {p['EPOCHS']} alone, as {kind} on {nproc} processes, "
        "and counted 10,000 images")


def _mid_epoch(run) -> None:
    rows = {r["loader"]: r for r in run.table("the rest of the epoch equal")}
    run.claim(rows.get("use_seedable_sampler=True", {}).get("the rest of the epoch equal") is True,
              "with the seedable sampler, the resumed epoch went on with the batches the whole epoch had left")
