"""What lesson 05 says about its run, checked from its artifacts (see course_lib.teaching.verify).

The launches stream every rank's lines into their cells, so what the processes printed (their rank and world size,
the distributed type, the resumed epoch) is read from the cells' text; what they logged is read from each run's
metrics.jsonl. The training run's own metrics.jsonl is replaced by the resume's (the resume runs in the same
folder), so its epochs are read from the table that compares it with raw DDP. The facts about Accelerate's loaders
that do not depend on the run (the seedable sampler, split_batches and even_batches) are tested in
tests/test_verify_lesson05.py.
"""
from __future__ import annotations

import ast
import math
import re

RUN = "runs/05_accelerate"


def check(run) -> None:
    p = run.parameters
    nproc, batch = p["NPROC"], p["BATCH_SIZE"]
    layout = run.cell_text("f1aac842")
    cpu, eval_cpu = (f"{nproc} training processes on CPU" in layout, f"{p['EVAL_NPROC']} evaluation processes on CPU"
                     in layout)
    kind = f"DistributedType.{'MULTI_CPU' if cpu else 'MULTI_GPU'}"
    per_process = math.ceil(math.ceil(60000 / batch) / nproc)
    _seed_snippet(run)
    _launches(run, p, nproc, kind, per_process)
    _tools(run, nproc, kind)
    _pitfall_and_evaluation(run, p, nproc, batch, cpu and eval_cpu)
    _resume(run, p, nproc, kind)
    _loaders_and_clipping(run)
    _precision_and_accumulation(run, p, nproc, kind, per_process)


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

    checkpoint = run.folder / RUN / "accelerate" / "checkpoints" / f"checkpoint-{p['EPOCHS'] - 1}.pt"
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
    resumed = run.events(f"{RUN}/accelerate")
    run.claim([r["epoch"] for r in resumed] == [p["EPOCHS"]] and all(
        r["world_size"] == nproc and r["distributed_type"] == kind and r["val_count"] == 10_000 for r in resumed),
        f"the resume under torchrun trained epoch {p['EPOCHS']} alone, as {kind} on {nproc} processes, "
        "and counted 10,000 images")


def _loaders_and_clipping(run) -> None:
    rows = {r["loader"]: r for r in run.table("the rest of the epoch equal")}
    run.claim(rows.get("use_seedable_sampler=True", {}).get("the rest of the epoch equal") is True,
              "with the seedable sampler, the resumed epoch went on with the batches the whole epoch had left")
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


def _precision_and_accumulation(run, p, nproc, kind, per_process) -> None:
    mp = run.events(f"{RUN}/{p['MIXED_PRECISION']}")
    run.claim(len(mp) == p["EPOCHS"] and all(r["mixed_precision"] == p["MIXED_PRECISION"]
                                             and r["world_size"] == nproc for r in mp),
              f"the config file's {p['MIXED_PRECISION']} reached all {nproc} processes")
    run.claim(all(r["distributed_type"] == kind and r["val_count"] == 10_000 for r in mp),
              f"the config file's MULTI_GPU launch ran as {kind} and counted 10,000 images")
    accum = run.events(f"{RUN}/accum")
    run.claim(len(accum) == p["EPOCHS"] and all(r["steps_per_epoch"] == per_process for r in accum),
              f"with accumulation each process still ran {per_process} batches per epoch")
    run.claim(all(r["optimizer_steps"] == math.ceil(per_process / p["GRAD_ACCUM"]) for r in accum),
              f"the optimizer stepped once per {p['GRAD_ACCUM']} batches")
    run.claim(bool(accum) and accum[-1]["scheduler_steps"] == accum[-1]["total_steps"],
              "the prepared scheduler reached its end exactly when training did")
    run.claim(bool(accum) and accum[-1]["lr"] < p["LR"] / 100 and all(r["val_count"] == 10_000 for r in accum),
              "one-cycle ended at a tiny learning rate, and every epoch counted 10,000 images")
    rows = run.table("step time vs DDP")
    run.claim(len(rows) == 4 and all(r["val_count"] == 10_000 and r["epochs"] == p["EPOCHS"] for r in rows),
              "the summary's four runs each trained EPOCHS epochs and counted 10,000 images")
    ready = (f"Ready: accelerate launch of {RUN}/train.py on {nproc} processes, arguments --batch-size "
             f"{p['BATCH_SIZE']} --lr {p['LR']} --epochs 1, mixed precision no.")
    run.claim(ready in run.cell_text("1293d07d"), "the launch panel is set to section 4's launch")
