"""What lesson 02b says about its run, checked from its artifacts (see course_lib.teaching.verify).

Part b trains the lesson's recipe and the seed's again, under ``runs/02_ddp/results/``, so that it runs on its own;
its checkpoint, results table, launch panel and global-batch runs are checked against those two runs.
"""
from __future__ import annotations

import math
import re

from .lesson02a import recipe_runs


def check(run) -> None:
    p = run.parameters
    lesson, seed = recipe_runs(run, "runs/02_ddp/results")
    if not lesson or not seed:
        return

    # Section 5: the checkpoint, loaded here into a plain MyModel and evaluated in this process; then a resume.
    state, correct = run.scored(f"runs/02_ddp/results/lesson/checkpoints/checkpoint-{p['EPOCHS'] - 1}.pt", batch=256)
    gloo = lesson[-1]["backend"] == "gloo"
    run.claim(not any(k.startswith("module.") for k in state["model"]), "the checkpoint holds the unwrapped model")
    run.claim(correct == lesson[-1]["val_correct"] if gloo else abs(correct - lesson[-1]["val_correct"]) <= 10,
              f"one process scores the checkpoint as the distributed evaluation did ({correct} vs "
              f"{lesson[-1]['val_correct']})")
    buffers = state["optimizer"]["state"]
    from course_lib import MyModel

    run.claim(len(buffers) == len(list(MyModel().parameters())) and all("momentum_buffer" in s for s in buffers.values()),
              "the checkpoint holds a momentum buffer for each parameter tensor")
    ratio = run.number(r"the first step after the resume is ([\d.]+)x")
    run.claim(ratio is not None and abs(ratio - 1) > 0.05,
              f"a resume with the optimizer's state takes another first step than a fresh optimizer ({ratio}x)")

    # Section 6: the seed's data pipeline.
    pipeline_text = run.cell_text("47ddd902")
    warned = re.search(r"rank 0 was warned (\d+) time", pipeline_text)
    times = int(warned.group(1)) if warned else -1
    run.claim(times in (0, 2), "the seed's pipeline run says how often rank 0 was warned about its workers: twice (the "
              f"loader built, one epoch's workers started) or, on a machine with cores enough, never; not {times}")
    run.claim(pipeline_text.count("This DataLoader will create") == min(times, 1),
              "the DataLoader warning is shown once, not once per rank and per start")

    # Section 7: the results table's line.
    run.claim(lesson[0]["val_acc"] >= 0.90, f"one epoch of cross-entropy reaches 90% (got {lesson[0]['val_acc']:.4f})")
    run.claim(lesson[0]["val_acc"] > max(m["val_acc"] for m in seed),
              "the lesson's recipe after 1 epoch beats the seed's best epoch")

    # Section 8: the launch panel.
    panel = run.events("runs/02_ddp/panel")
    run.claim([m["val_count"] for m in panel] == [10_000], "the launch panel's run finished its epoch and evaluated")

    # Section 9: the global-batch runs.
    rows = run.table("samples seen")
    run.claim(len(rows) >= 2 and len({r["samples seen"] for r in rows}) == 1,
              "the global-batch runs all saw the same number of samples")
    for row in rows:
        found = re.match(r"(\d+) process(?:es)?, batch (\d+)", row["recipe"])
        runs = run.events(f"runs/02_ddp/batch/{found.group(1)}x{found.group(2)}") if found else []
        run.claim(bool(runs) and runs[-1]["steps"] == row["steps"] and runs[-1]["val_count"] == 10_000,
                  f"the run '{row['recipe']}' took its {row['steps']} steps and evaluated 10,000 samples")
    run.claim(math.isfinite(sum(r["val top-1"] for r in rows)), "every global-batch run has an accuracy")
