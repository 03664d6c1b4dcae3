"""What part 06b of lesson 06 says about its run, checked from its artifacts (see course_lib.teaching.verify).

The launches are read from what the notebook printed of each rank, the metrics they logged and the checkpoint folders
the Trainer wrote (trainer_state.json, model.safetensors). The first distributed run's metrics.jsonl is replaced by the
resume's (both run in runs/06_trainer), so its epochs are read from the records the notebook printed.
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
    _plain_trainer(run)
    gpus = run.found(r"(\d+) CUDA GPU", run.cell_text("00a5cbc7"), required=False)
    _pitfall(run, p, gpus is not None and int(gpus[0]) == 0)
    _distributed(run, p)
    _early_stopping(run)
    _saved(run, p)


def _plain_trainer(run) -> None:
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


def _saved(run, p) -> None:
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
