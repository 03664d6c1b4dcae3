"""What part 06a of lesson 06 says about its run, checked from its artifacts (see course_lib.teaching.verify).

The seed's defects are read from the errors their cells print; the fixed example's in-process run from what its cell
prints. That nll_loss of log_softmax is cross_entropy, a fact of PyTorch, is tested in tests/test_verify_lesson06.py.
"""
from __future__ import annotations

import ast


def check(run) -> None:
    _defects(run)
    _seed_fixed(run)


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


def _seed_fixed(run) -> None:
    seed = run.cell_text("140c3080")
    top1 = run.found(r"val top-1 ([\d.]+), top-3 [\d.]+ over (\d+) samples", seed, required=False)
    run.claim(top1 is not None and int(top1[1]) == 10_000,
              "the seed's example, fixed, evaluated all 10,000 validation images")
    run.claim(top1 is not None and float(top1[0]) > 0.85, f"one epoch of the seed's example passes 85% ({top1})")
    device = run.found(r"the model is on (\S+), training_args.device is (\S+)", seed, required=False)
    run.claim(device is not None and device[0] == device[1], f"the Trainer moved the model to its device ({device})")
