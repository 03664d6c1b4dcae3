"""Checks of lesson 05 (Accelerate): a ported loop, gather_for_metrics."""
from __future__ import annotations

import math
import re
from pathlib import Path

from .harness import (CheckFailed, Report, launch_script, rank_outputs, reference_accuracy, secret_correct,
                      secret_mnist)


def check_accelerate_training(script, nproc: int = 2, max_steps: int | None = None) -> None:
    """Task 05.1: lesson 05's train.py with its Accelerate lines runs as one job of ``nproc`` processes, sharded, in sync.
    It trains on MNIST with its classes renamed by a secret permutation (harness.secret_mnist), and the check evaluates
    the checkpoint it saved."""
    report = Report("05.1", f"the Accelerate port on {nproc} processes")
    args = ["--epochs", "1"] + (["--max-steps", str(max_steps)] if max_steps else [])
    with secret_mnist() as (data, _):
        result = launch_script("05.1", script, nproc=nproc, script_args=[*args, "--data-dir", str(data)],
                               allow_failure=True)
        judged = secret_correct(Path(result.run_dir) / "checkpoints" / "checkpoint-0.pt", data)
    _judge_port(report, script, nproc, result, judged)


def _judge_port(report, script, nproc, result, judged) -> None:
    from course_lib.launch import failure_message

    outputs = rank_outputs(result)
    # Each process prints "rank R/W (local rank L) ..." as soon as its Accelerator exists.
    worlds = {r: re.findall(r"rank \d+/(\d+) \(local rank", text) for r, text in outputs.items()}
    alone = sorted(r for r, found in worlds.items() if found and int(found[0]) == 1)
    if nproc > 1 and alone:
        report.stop(f"Accelerate saw 1 process on rank(s) {alone}, expected {nproc}: each process trained alone "
                    "on all the data", "Pass cpu=not use_cuda to Accelerator(): a process without a GPU of its own "
                    "otherwise joins no process group (lesson 05, section 5).")
    if not result.ok:
        raise CheckFailed(f"Task 05.1: {script} failed on {nproc} processes.\n{failure_message(result)[-4000:]}")
    epochs = result.events("epoch")
    if not epochs:
        report.stop("the script logged no `epoch` metrics", "Keep the script's log_metrics call as given.")
    last = epochs[-1]
    report.expect(last.get("world_size") == nproc,
                  f"Accelerate saw {nproc} processes ({last.get('distributed_type')})",
                  f"Accelerate saw {last.get('world_size')} process(es), expected {nproc}: each rank trained alone",
                  "Create one Accelerator, asking for the CPU unless every process has a GPU of its own.")
    share = math.ceil(math.ceil(60000 / 256) / nproc)  # a prepared loader: the 235 batches split over the processes
    report.expect(last.get("steps_per_epoch") == share,
                  f"each process's loader holds {share} of the {math.ceil(60000 / 256)} batches",
                  f"each process's loader holds {last.get('steps_per_epoch')} batches, expected {share}",
                  "Pass the training loader through accelerator.prepare: it gives every process its own share.")
    steps, scheduler_steps = last.get("steps") or 0, last.get("scheduler_steps")
    report.expect(scheduler_steps == nproc * steps,
                  f"the prepared scheduler stepped {scheduler_steps} times: once per process for each of the "
                  f"{steps} optimizer steps, as its length (written for one process) expects",
                  f"the scheduler stepped {scheduler_steps} times for {steps} optimizer steps, expected {nproc * steps}",
                  "Prepare the scheduler with the model, the optimizer and the loaders, in one prepare() call.")
    sums = {r: re.findall(r"parameter checksum ([-\d.e+]+)", outputs.get(r, "")) for r in range(nproc)}
    report.expect(all(sums.values()) and len({s[-1] for s in sums.values()}) == 1,
                  "every process ends with the same weights",
                  f"the processes end with different weights: {sums}",
                  "Gradients are synchronised only through the prepared model and accelerator.backward(loss).")
    acc = last.get("val_acc") or 0
    report.expect(acc > 0.85, f"validation accuracy {acc:.4f}", f"validation accuracy {acc:.4f}, expected above 0.85",
                  "Step the optimizer after accelerator.backward(loss), and zero the gradients each step.")
    report.expect(judged is not None and abs(judged / 10000 - acc) <= 0.001,
                  f"the saved checkpoint, evaluated by the check on this run's labels, scores {(judged or 0) / 10000:.4f}",
                  f"the saved checkpoint scores {'nothing' if judged is None else f'{judged / 10000:.4f}'} on this "
                  f"run's labels, the script logged {acc:.4f}",
                  "Train on the data the script is given (--data-dir) and keep its save_checkpoint call.")
    report.done()


def check_gather_for_metrics(script, nproc: int = 3) -> None:
    """Task 05.2: an Accelerate evaluation that counts each validation sample once at 3 processes."""
    report = Report("05.2", f"evaluate() with Accelerate on {nproc} processes")
    with secret_mnist() as (data, _):  # labels the script cannot know: its accuracy must be measured
        want_acc, want_count = reference_accuracy(data_folder=data)
        result = launch_script("05.2", script, nproc=nproc, script_args=["--data-dir", str(data)])
    evals = result.events("eval")
    if not evals:
        report.stop("the script logged no `eval` metrics", "Keep the script's log_metrics call as given.")
    count, acc = evals[-1].get("val_count"), evals[-1].get("val_acc") or 0
    if count == want_count:
        report.ok(f"count = {count}")
    elif count and count > want_count:
        report.fail(f"count = {count}: {count - want_count} sample(s) counted twice",
                    "The prepared loader repeats samples to even out the last batch; gather_for_metrics drops them.")
    else:
        report.fail(f"count = {count}, expected {want_count}",
                    "Gather the predictions and labels of all processes before counting.")
    report.expect(abs(acc - want_acc) < 6e-4, f"accuracy {acc:.4f} equals one process's {want_acc:.4f}",
                  f"accuracy {acc:.4f}, one process over all samples gives {want_acc:.4f}")
    report.done()
