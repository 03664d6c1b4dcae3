"""What lesson 03's first part (03a_pitfalls_setup_and_evaluation: sections 1-6) says about its run, checked from its
artifacts (see course_lib.teaching.verify).

The facts about a library that do not depend on the run (SyncBatchNorm refusing CPU modules) are unit tests instead:
tests/test_verify_lesson03.py.
"""
from __future__ import annotations

import math
import re

RUNS = "runs/03_ddp_pitfalls"


def _exit_code(text: str) -> int | None:
    found = re.search(r"exit code (-?\d+)", text)
    return int(found.group(1)) if found else None


def check(run) -> None:
    p = run.parameters
    epochs = p["EPOCHS"]
    run.claim(p["LOOP_EPOCHS"] >= 2, "LOOP_EPOCHS is at least 2: section 3 needs an evaluation before the last one")
    fixed = run.events(f"{RUNS}/fixed")
    run.claim(len(fixed) == epochs and all(m["val_count"] == 10_000 for m in fixed),
              f"section 1's fixed run logged its {epochs} epoch(s), each with the ranks' counts all-reduced to 10,000")
    if not fixed:
        return
    world, backend = fixed[-1]["world_size"], fixed[-1]["backend"]
    tolerance = 0 if backend == "gloo" else 10  # a GPU run may differ in a few near-ties (TF32 convolutions)
    observed = {row["§"]: row["observed"] for row in run.table("observed")}

    # 1. The seed's cuda + nccl setup, then the base's.
    seed_init = run.cell_text("8b479fd3")
    if backend == "nccl":
        run.claim(_exit_code(seed_init) == 0
                  and all(re.search(rf"\[rank{r}\].*backend nccl", seed_init) for r in range(world)),
                  "with a GPU per process, the seed's setup runs and every rank says backend nccl")
    else:
        run.claim(_exit_code(seed_init) not in (None, 0) and "failed in torch.cuda.set_device: '" in seed_init,
                  "without a GPU per process, the seed's setup fails in torch.cuda.set_device")
    printed = re.findall(r"rank (\d+)/(\d+) \(local rank \d+\) on \S+, backend (\w+)", run.cell_text("7b2a1ffd"))
    run.claim(sorted({int(r) for r, _, _ in printed}) == list(range(world))
              and all(int(w) == world and b == backend for _, w, b in printed)
              and f"Every rank chose {backend};" in run.cell_text("7b2a1ffd"),
              f"each of the {world} ranks of the fixed run printed its rank and the backend the workbook chose ({backend})")
    nccl = run.cell_text("621799ec")
    run.claim("nccl is possible here" in nccl if backend == "nccl" else "LaunchConfigError: " in nccl,
              "course_lib.torchrun refuses backend='nccl' exactly where the workbook chose gloo")

    # 2. The seed's recipe against lesson 02's, on the same program and steps.
    seed_recipe = run.events(f"{RUNS}/seed_recipe")
    ce_acc, seed_acc = fixed[-1]["val_acc"], seed_recipe[-1]["val_acc"] if seed_recipe else math.nan
    run.claim(ce_acc > seed_acc + 0.05,
              f"cross-entropy ({ce_acc:.4f}) clearly beats the seed's MSE with lr 0.001 ({seed_acc:.4f})")
    if p["MAX_STEPS"] is None:  # whole epochs, as in lesson 02
        run.claim(ce_acc >= 0.90, f"one epoch of cross-entropy reaches 90% (got {ce_acc:.4f})")

    # Section 1's checkpoint, scored again in this process (sections 2 and 7).
    state, correct = run.scored(f"{RUNS}/fixed/checkpoints/checkpoint-{epochs - 1}.pt")
    in_run = fixed[-1]["val_correct"]
    shown = re.search(r"(\d+) / 10000 correct in this process", run.cell_text("6ad4e3e5"))
    run.claim(shown is not None and int(shown.group(1)) == correct and abs(correct - in_run) <= tolerance,
              f"one process counts as many correct predictions of section 1's checkpoint as the run's distributed "
              f"evaluation ({correct} here, {shown and shown.group(1)} printed, {in_run} in the run)")

    # 3. The seed's loop: rank 0 evaluates through the DDP wrapper, alone.
    if world >= 2:
        loop, last = run.cell_text("f17571b4"), p["LOOP_EPOCHS"] - 1
        run.claim(_exit_code(loop) not in (None, 0), "the seed's loop fails")
        run.claim("[rank0] epoch 0: rank 0 val_acc" in loop
                  and [m["epoch"] for m in run.events(f"{RUNS}/seed_loop")] == [0],
                  "the seed's first evaluation, after epoch 0, passes")
        run.claim(f"[rank0] epoch {last}: rank 0 val_acc" not in loop,
                  f"the seed's last evaluation, after epoch {last}, does not finish")
        evaluations = loop.count("rank 0 evaluates through DistributedDataParallel")
        run.claim(evaluations >= 2 and loop.count("its first forward broadcasts buffers: True") == evaluations,
                  "the script prints True before each of rank 0's evaluations (each one's first forward broadcasts)")
        run.claim("[rank1] rank 1: leaving the process group" in loop,
                  "rank 1 has left the process group while rank 0 evaluates")
        sign = re.search(r"failed in DDP's buffer broadcast: '([^']*)'", observed.get(3, ""))
        run.claim(sign is not None and (sign.group(1) != "None" or backend == "nccl"),
                  "rank 0 fails with gloo's 'Connection closed by peer' or a timeout (printed: "
                  f"{sign and sign.group(1)!r})")
    run.claim([m["epoch"] for m in fixed] == list(range(epochs)) and _exit_code(run.cell_text("a049b55d")) == 0,
              "the fixed program evaluated after every epoch, the last one included, and exited with 0")
    bn = run.events(f"{RUNS}/fixed", "bn_buffers")
    if world >= 2:
        run.claim(bool(bn) and bn[-1]["max_diff_before"] > 0 and bn[-1]["max_diff_after"] == 0,
                  "the ranks' BatchNorm statistics differ after training and are equal after the broadcast "
                  f"({bn and bn[-1]})")

    # 4-6. The checkpoint evaluated three ways on EVAL_NPROC processes.
    eval_nproc = p["EVAL_NPROC"]
    ev = {**run.events(f"{RUNS}/eval_shards", "seed_eval")[0], **run.events(f"{RUNS}/eval_shards", "eval")[0]}
    shard = math.ceil(10_000 / eval_nproc)
    run.claim(ev["seed_count"] == shard,
              f"rank 0's DistributedSampler shard is ceil(10000 / {eval_nproc}) = {shard} samples (got {ev['seed_count']})")
    run.claim(ev["padded_count"] == shard * eval_nproc and (ev["padded_count"] > 10_000 or 10_000 % eval_nproc == 0),
              f"all-reduced over DistributedSampler shards, the counts come to {shard * eval_nproc} samples, padding "
              f"included (got {ev['padded_count']})")
    run.claim(ev["val_count"] == 10_000, "the base's unpadded shards count 10,000 samples")
    run.claim(abs(ev["val_correct"] - correct) <= (0 if ev["backend"] == "gloo" else 10),
              f"the unpadded shards count the single process's correct predictions ({ev['val_correct']} vs {correct})")
    run.claim(bool(ev["seed_last_batch"]) and ev["seed_acc_batch_avg"] != ev["seed_acc_sample_weighted"],
              "rank 0's shard ends with a smaller batch, and the mean over batches is not correct / count")

    run.claim(all(section in observed for section in range(1, 7)),
              f"every section 1-6 recorded what it observed (got {sorted(map(str, observed))})")
