"""What lesson 06 says about its run, checked from its artifacts (see course_lib.teaching.verify).

The seed's defects are read from the errors their cells print; the in-process Trainer runs from what their cells
print and the tables they draw; the launches from what the notebook printed of each rank, the metrics they logged
and the checkpoint folders the Trainer wrote (trainer_state.json, model.safetensors). The first distributed run's
metrics.jsonl is replaced by the resume's (both run in runs/06_trainer), so its epochs are read from the records
the notebook printed. That nll_loss of log_softmax is cross_entropy, a fact of PyTorch, is tested in
tests/test_verify_lesson06.py.
"""
from __future__ import annotations

import ast
import json
import math
import re

RUN = "runs/06_trainer"


def _checkpoints(run, folder: str) -> list:
    """The checkpoint-STEP folders the Trainer left in ``folder``, oldest step first."""
    return sorted((run.folder / folder).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))


def check(run) -> None:
    p = run.parameters
    _defects(run)
    _in_process(run, p)
    gpus = run.found(r"(\d+) CUDA GPU", run.cell_text("00a5cbc7"), required=False)
    _pitfall(run, p, gpus is not None and int(gpus[0]) == 0)
    _distributed(run, p)
    _early_stopping(run)
    _saved_and_levels(run, p)


def _defects(run) -> None:
    shown = {cid: run.cell_text(cid) for cid in ("8ca3ca14", "1a9e4475", "7fa7f958", "06eb72a0", "a8b6cc56",
                                                  "54eeb6d0", "ff1c476a")}
    run.claim("TypeError:" in shown["8ca3ca14"] and "evaluation_strategy" in shown["8ca3ca14"],
              "2a: TrainingArguments refuses evaluation_strategy with a TypeError")
    run.claim("NameError: name 'train_dset' is not defined" in shown["1a9e4475"],
              "2b: the seed's Trainer call stops with a NameError on train_dset")
    run.claim("AttributeError:" in shown["7fa7f958"] and "fit" in shown["7fa7f958"],
              "2c: trainer.fit() is an AttributeError")
    run.claim("TypeError:" in shown["06eb72a0"] and "num_items_in_batch" in shown["06eb72a0"],
              "2d: the old compute_loss signature fails on num_items_in_batch")
    run.claim("collate_fn: ValueError:" in shown["a8b6cc56"] and "one element tensors" in shown["a8b6cc56"],
              "2e: the seed's collator fails on one-hot labels")
    nll = run.found(r"nll_loss: +RuntimeError: (.*)", shown["a8b6cc56"], required=False)
    run.claim(nll is not None and "target" in nll[0], "2e: nll_loss refuses a one-hot target")
    logged = run.found(r"logged 'loss' every 25 steps: (\[.*\])", shown["54eeb6d0"], required=False)
    losses = ast.literal_eval(logged[0]) if logged else []
    run.claim(bool(losses) and losses[-1] < 0 and losses[-1] < losses[0],
              f"2f: nll_loss on raw outputs falls below zero ({losses})")
    run.claim("nll_loss(log_softmax(logits)) == cross_entropy(logits): True" in shown["54eeb6d0"],
              "2f: nll_loss of log_softmax is cross_entropy")
    run.claim("without label_names: TypeError:" in shown["ff1c476a"] and "labels" in shown["ff1c476a"],
              "2g: without label_names the evaluation fails on the labels")
    counts = run.found(r"(\d+) predictions for (\d+) labels \((\d+) batches", shown["ff1c476a"], required=False)
    run.claim(counts is not None and int(counts[0]) == int(counts[1]) - int(counts[2]),
              f"2g: returning the logits tensor loses one sample per batch ({counts})")


def _in_process(run, p) -> None:
    seed = run.cell_text("140c3080")
    top1 = run.found(r"val top-1 ([\d.]+), top-3 [\d.]+ over (\d+) samples", seed, required=False)
    run.claim(top1 is not None and int(top1[1]) == 10_000,
              "the seed's example, fixed, evaluated all 10,000 validation images")
    run.claim(top1 is not None and float(top1[0]) > 0.85, f"one epoch of the seed's example passes 85% ({top1})")
    device = run.found(r"the model is on (\S+), training_args.device is (\S+)", seed, required=False)
    run.claim(device is not None and device[0] == device[1], f"the Trainer moved the model to its device ({device})")

    rows = run.table("effective batch")
    run.claim(len(rows) == 4 and all(r["effective batch"] == 256 and r["optimizer steps"] == p["ACCUM_STEPS"]
                                     for r in rows),
              f"1 x 256 and 4 x 64 accumulated both make {p['ACCUM_STEPS']} optimizer steps of an effective 256")
    plain = [float(r["weights differ by"].split()[0]) for r in rows
             if r["model"] == "MyModel without BatchNorm" and "weights differ by" in r]
    run.claim(bool(plain) and max(plain) < 1e-4,
              f"without BatchNorm, accumulation ends where one big batch does, up to rounding ({plain})")
    run.claim("mixed precision bf16; output dtypes {'conv': torch.bfloat16, 'head': torch.bfloat16}; "
              "logits torch.float32" in run.cell_text("8fc2ef18"),
              "under bf16=True both convolutions compute in bfloat16 and compute_loss receives float32 logits")
    untrained = run.cell_text("c9987978")
    acc = run.found(r"label keys found by the Trainer: \['labels'\]; untrained: eval_acc ([\d.]+) over 10000 samples",
                 untrained, required=False)
    run.claim(acc is not None, "the plain Trainer finds the label key itself and evaluates all 10,000 images")
    run.claim(acc is not None and float(acc[0]) < 0.3, f"the untrained model is near chance ({acc})")


def _pitfall(run, p, no_gpu) -> None:
    shown = run.cell_text("9448068c")
    if not no_gpu or "Skipped" in shown:
        return
    nproc = p["NPROC"]
    said = re.findall(r"torchrun rank (\d+): rank (\d+): world_size=(\d+)", shown)
    run.claim(len(said) == nproc and all(r == "0" and ws == "1" for _, r, ws in said),
              f"without use_cpu, each of the {nproc} ranks believed it was rank 0 of 1 ({said})")
    # The cell prints each rank's line indented under its "torchrun rank" line (the launch's own output is above).
    built = re.findall(r"^ +rank \d+: model wrapped as (\w+); \w+ gives (\d+) training batches", shown, re.M)
    run.claim(len(built) == nproc and all(w == "MnistClassifier" and int(b) == math.ceil(60000 / p["BATCH_SIZE"])
                                          for w, b in built),
              f"without use_cpu, no rank was wrapped in DDP and each held all the batches ({built})")
    run.claim(len(run.events(f"{RUN}/world_check")) == nproc,
              "without use_cpu, every rank wrote its own epoch record as a 'rank 0'")


def _distributed(run, p) -> None:
    nproc, batch = p["NPROC"], p["BATCH_SIZE"]
    per_rank = math.ceil(math.ceil(60000 / batch) / nproc)
    eval_batches = math.ceil(math.ceil(10000 / batch) / nproc)
    shown = run.cell_text("1682633b")
    said = {int(r): (int(ws), int(env)) for r, ws, env in
            re.findall(r"rank (\d+): world_size=(\d+) \(WORLD_SIZE=(\d+)\)", shown)}
    run.claim(sorted(said) == list(range(nproc)) and all(ws == env == nproc for ws, env in said.values()),
              f"with use_cpu, every rank saw world size {nproc} ({said})")
    built = re.findall(r"model wrapped as (\w+); \w+ gives (\d+) training batches per epoch; "
                       r"evaluation: (\d+) batches, (\d+) samples", shown)
    run.claim(len(built) == nproc and all(w == "DistributedDataParallel" and int(b) == per_rank
                                          for w, b, _, _ in built),
              f"the Trainer wrapped every rank in DDP and gave it {per_rank} of the batches ({built})")
    run.claim(len(built) == nproc and all(int(e) == eval_batches and int(s) == eval_batches * batch
                                          for _, _, e, s in built),
              f"every rank evaluated {eval_batches} batches of {batch}, padding included")
    records = [ast.literal_eval(line) for line in run.cell_text("22e899eb").splitlines()
               if line.startswith("{'event': 'epoch'")]
    run.claim(len(records) == p["EPOCHS"] and bool(records) and records[-1]["val_count"] == 10_000
              and records[-1]["world_size"] == nproc and records[-1]["steps"] == per_rank,
              f"the run trained {p['EPOCHS']} epoch(s) of {per_rank} steps on {nproc} processes and "
              "compute_metrics counted 10,000 images")

    launchers = run.titled("train.py, ", required=False)
    rows = launchers["rows"] if launchers else []
    keys = ["world_size", "backend", "steps", "val_count", "train_loss", "val_acc", "val_acc3"]
    run.claim(len(rows) == 2 and all(r["world_size"] == nproc for r in rows),
              f"torchrun and accelerate launch both started a world of {nproc}")
    run.claim(len(rows) == 2 and all(rows[0][k] == rows[1][k] for k in keys),
              "torchrun and accelerate launch logged the same values, to the last digit")

    saved = run.found(r"trainer_state.json: global_step=(\d+), epoch=([\d.]+)", run.cell_text("605904d3"), required=False)
    run.claim(saved is not None and float(saved[1]) == p["EPOCHS"] and "model.safetensors" in
              run.cell_text("605904d3"), f"the first launch's last checkpoint is of epoch {p['EPOCHS']}, with its weights")
    start = run.found(r"training starts at step (\d+)", run.cell_text("81e9a029"), required=False)
    run.claim(saved is not None and start is not None and start[0] == saved[0],
              f"the second launch started at the checkpoint's step ({start} vs {saved})")
    resumed = run.events(RUN)
    run.claim([r["epoch"] for r in resumed] == [p["EPOCHS"]] and all(r["val_count"] == 10_000 for r in resumed),
              "the resumed launch ran only the one new epoch and counted 10,000 images")


def _early_stopping(run) -> None:
    kept = _checkpoints(run, f"{RUN}/early-stopping")
    state = json.loads((kept[-1] / "trainer_state.json").read_text()) if kept else {}
    evals = [h for h in state.get("log_history", []) if "eval_acc" in h]
    best = max(evals, key=lambda h: h["eval_acc"]) if evals else {}
    best_name = (state.get("best_model_checkpoint") or "").replace("\\", "/").rsplit("/", 1)[-1]
    names = {p.name for p in kept}
    run.claim(len(kept) <= 2 and names == {best_name, f"checkpoint-{state.get('global_step')}"},
              f"save_total_limit=2 left the best and the last checkpoints ({sorted(names)})")
    run.claim(bool(best) and best_name == f"checkpoint-{best['step']}" and state.get("best_metric") == best["eval_acc"],
              "the best checkpoint is the one with the best eval_acc")
    shown = run.cell_text("l06-best-show")
    run.claim("tensor for tensor: True" in shown, "at the end the model holds the best checkpoint's weights")
    again = run.found(r"trainer.evaluate\(\) gives ([\d.]+) again", shown, required=False)
    run.claim(again is not None and bool(best) and abs(float(again[0]) - best["eval_acc"]) < 1e-4,
              f"evaluating the model at the end gives the best accuracy again ({again})")


def _saved_and_levels(run, p) -> None:
    from safetensors.torch import load_file

    final = _checkpoints(run, f"{RUN}/checkpoints")[-1]
    run.claim(all(key.startswith("model.") for key in load_file(final / "model.safetensors")),
              "every key of the saved weights starts with the wrapper's `model.`")
    scores = run.found(r"plain MyModel: top-1 ([\d.]+), top-3 [\d.]+; the Trainer's evaluation of the same weights: "
                    r"([\d.]+)", run.cell_text("1157173d"), required=False)
    run.claim(scores is not None and abs(float(scores[0]) - float(scores[1])) < 1e-3,
              f"a plain MyModel scores the saved weights as the Trainer did ({scores})")
    history = json.loads((final / "trainer_state.json").read_text())["log_history"]
    run.claim(len([h for h in history if "eval_acc" in h]) == p["EPOCHS"] + 1,
              "the resumed run's trainer_state.json holds the evaluations of both launches")

    levels = {stem: run.events(f"{RUN}/{stem}") for stem in ("level_ddp", "level_accelerate", "level_trainer")}
    run.claim(all(len(records) == p["LEVEL_EPOCHS"] and all(r["val_count"] == 10_000 and r["world_size"] == p["NPROC"]
                                                         for r in records) for records in levels.values()),
              f"each level trained {p['LEVEL_EPOCHS']} epoch(s) on {p['NPROC']} processes and counted 10,000 images")
    run.claim(len({r["steps"] for records in levels.values() for r in records}) == 1,
              "the three levels took the same steps per epoch")
    run.claim(all(r["val_acc"] > 0.85 for records in levels.values() for r in records),
              "every level trains the model past 85%")
