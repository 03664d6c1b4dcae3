"""What lesson 05's third part (05c_accelerate_precision_accumulation) says about its run, checked from its artifacts
(see course_lib.teaching.verify).

What the launches logged is read from each run's metrics.jsonl; the clipping experiment from its table. The facts
about Accelerate's loaders that do not depend on the run (split_batches and even_batches) are tested in
tests/test_verify_lesson05.py.
"""
from __future__ import annotations

import ast
import math

from .lesson05a import launch_facts

RUN = "runs/05_accelerate"


def check(run) -> None:
    p = run.parameters
    nproc, kind, per_process = launch_facts(run, "e05c1a70")
    _clipping(run)
    _precision(run, p, nproc, kind)
    _accumulation(run, p, per_process)


def _clipping(run) -> None:
    clipped = {r["clipping"].split(" ")[0]: r for r in run.table("norm before clipping")}
    right, wrong = clipped.get("at", {}), clipped.get("after", {})
    # The table shows lists as their text: read them back.
    run.claim(ast.literal_eval(right.get("sync_gradients per batch", "[]")) == [False, True],
              "with 2 accumulation steps, only the second batch synchronises")
    before = [float(n) for n in ast.literal_eval(right.get("norm before clipping", "[]"))]
    run.claim(len(before) == 1 and before[0] > 0.5 and right.get("norm after") == "0.500",
              f"clipped once, the accumulated gradient had more than 0.5 and ends with exactly 0.5 ({right})")
    cosine = run.found(r"cosine (-?[\d.]+) with the right one", run.cell_text("46d98264"), required=False)
    run.claim(cosine is not None and (float(cosine[0]) < 0.9999 or wrong.get("norm after") != "0.500"),
              f"clipping after every batch gives another gradient (cosine {cosine})")


def _precision(run, p, nproc, kind) -> None:
    mp = run.events(f"{RUN}/{p['MIXED_PRECISION']}")
    run.claim(len(mp) == p["EPOCHS"] and all(r["mixed_precision"] == p["MIXED_PRECISION"]
                                             and r["world_size"] == nproc for r in mp),
              f"the config file's {p['MIXED_PRECISION']} reached all {nproc} processes")
    run.claim(all(r["distributed_type"] == kind and r["val_count"] == 10_000 for r in mp),
              f"the config file's MULTI_GPU launch ran as {kind} and counted 10,000 images")
    fp32 = run.events(f"{RUN}/fp32")
    run.claim(len(fp32) == p["EPOCHS"] and all(r["mixed_precision"] == "no" and r["world_size"] == nproc
                                               and r["distributed_type"] == kind for r in fp32),
              f"the float32 run it is compared with trained {p['EPOCHS']} epoch(s) in full precision, as {kind} "
              f"on {nproc} processes")


def _accumulation(run, p, per_process) -> None:
    accum = run.events(f"{RUN}/accum")
    run.claim(len(accum) == p["EPOCHS"] and all(r["steps_per_epoch"] == per_process for r in accum),
              f"with accumulation each process still ran {per_process} batches per epoch")
    run.claim(all(r["optimizer_steps"] == math.ceil(per_process / p["GRAD_ACCUM"]) for r in accum),
              f"the optimizer stepped once per {p['GRAD_ACCUM']} batches")
    run.claim(bool(accum) and accum[-1]["scheduler_steps"] == accum[-1]["total_steps"],
              "the prepared scheduler reached its end exactly when training did")
    run.claim(bool(accum) and accum[-1]["lr"] < p["LR"] / 100 and all(r["val_count"] == 10_000 for r in accum),
              "one-cycle ended at a tiny learning rate, and every epoch counted 10,000 images")
    rows = run.table("step time vs float32")
    run.claim(len(rows) == 3 and all(r["val_count"] == 10_000 and r["epochs"] == p["EPOCHS"] for r in rows),
              "the summary's three runs each trained EPOCHS epochs and counted 10,000 images")
