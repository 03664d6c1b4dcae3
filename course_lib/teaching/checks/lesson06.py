"""Checks of lesson 06 (Trainer): compute_loss with num_items_in_batch, a distributed Trainer run."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from .harness import CheckFailed, NotAttempted, Report, call, launch_script, secret_correct, secret_mnist, shared_folder


def check_compute_loss(trainer_class) -> None:
    """Task 06.1: ``compute_loss`` with cross-entropy, ``num_items_in_batch``, and outputs the Trainer can read."""
    import warnings

    import torch.nn.functional as F
    from transformers import TrainingArguments

    from course_lib.model import MyModel

    report = Report("06.1", "compute_loss(model, inputs, return_outputs, num_items_in_batch)")
    torch.manual_seed(0)
    model = MyModel().eval()
    X, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    with shared_folder() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = TrainingArguments(output_dir=tmp, report_to="none", use_cpu=True, label_names=["labels"],
                                 remove_unused_columns=False)
        trainer = call("06.1", trainer_class, model=model, args=args)
        with torch.no_grad():
            logits = model(X)
            mean = F.cross_entropy(logits, y).item()
            total = F.cross_entropy(logits, y, reduction="sum").item()
            raw_nll = F.nll_loss(logits, y).item()
            loss = call("06.1", trainer.compute_loss, model, {"x": X, "labels": y})
            value = float(loss)
            if math.isclose(value, mean, rel_tol=1e-4):
                report.ok(f"without num_items_in_batch: the mean cross-entropy ({value:.4f})")
            elif math.isclose(value, raw_nll, rel_tol=1e-4):
                report.fail(f"the loss {value:.4f} is nll_loss of the raw outputs (the seed's bug), not cross-entropy {mean:.4f}",
                            "nll_loss expects log-probabilities; the model returns raw scores (logits).")
            else:
                report.fail(f"without num_items_in_batch the loss is {value:.4f}, expected the mean cross-entropy {mean:.4f}")
            loss = call("06.1", trainer.compute_loss, model, {"x": X, "labels": y}, num_items_in_batch=torch.tensor(32))
            report.expect(math.isclose(float(loss), total / 32, rel_tol=1e-4),
                          f"with num_items_in_batch=32: the summed loss / 32 ({float(loss):.4f})",
                          f"with num_items_in_batch=32 the loss is {float(loss):.4f}, expected sum / 32 = {total / 32:.4f}",
                          "With gradient accumulation the Trainer passes the number of labels in the whole "
                          "accumulated batch: sum the per-sample losses and divide by it.")
            out = call("06.1", trainer.compute_loss, model, {"x": X, "labels": y}, return_outputs=True)
            report.expect(isinstance(out, tuple) and len(out) == 2, "return_outputs=True gives (loss, outputs)",
                          f"return_outputs=True gave {type(out).__name__}, expected a (loss, outputs) pair")
            try:
                _, predicted, labels = trainer.prediction_step(model, {"x": X, "labels": y}, prediction_loss_only=False)
                shape = tuple(predicted.shape) if torch.is_tensor(predicted) else type(predicted).__name__
            except Exception as exc:
                shape = f"an error ({type(exc).__name__}: {str(exc)[:120]})"
            report.expect(shape == (8, 10), "the Trainer's evaluation finds logits of shape (8, 10) in the outputs",
                          f"the Trainer's evaluation finds logits {shape} in the outputs, expected (8, 10)",
                          "In evaluation the Trainer drops the first element of a tuple or tensor output (it "
                          "assumes it is the loss); return the logits in a dict, e.g. {'logits': ...}.")
    report.done()


def check_trainer_run(script, nproc: int = 2, max_steps: int | None = None) -> None:
    """Task 06.2: the Trainer trains on ``nproc`` processes and evaluates every validation sample once.

    ``max_steps``: optimizer steps per epoch (the script's ``--max-steps``); None trains the whole epoch. The run
    trains on MNIST with its classes renamed by a secret permutation (harness.secret_mnist), and the check evaluates
    the weights the script saves at the end (``RUN_DIR/final.pt``).
    """
    report = Report("06.2", f"Trainer on {nproc} processes")
    script_args = ["--epochs", "1"] + (["--max-steps", str(max_steps)] if max_steps else [])
    with secret_mnist() as (data, _):
        try:
            result = launch_script("06.2", script, nproc=nproc, script_args=[*script_args, "--data-dir", str(data)])
        except CheckFailed as failed:
            if isinstance(failed, NotAttempted) or "the Trainer sees" not in str(failed):
                raise
            result = None  # the script's own check of the world size stopped the run
        judged = None if result is None else secret_correct(Path(result.run_dir) / "final.pt", data)
    if result is None:
        report.stop(f"torchrun started {nproc} processes, but the Trainer on each saw a smaller world",
                    "Without a GPU per process the Trainer needs the CPU asked for explicitly: pass "
                    "use_cpu=not use_cuda to TrainingArguments.")
    records = result.events("epoch")
    if not records:
        report.stop("the script logged no `epoch` record: the Trainer never evaluated during training",
                    "transformers 5 names the option eval_strategy (evaluation_strategy is gone); use \"epoch\".")
    last = records[-1]
    report.expect(last.get("world_size") == nproc, f"the Trainer ran as one job of {nproc} processes",
                  f"the Trainer saw a world of {last.get('world_size')}, expected {nproc}")
    report.expect(last.get("val_count") == 10000, "its evaluation counted all 10000 validation samples once",
                  f"its evaluation counted {last.get('val_count')} samples, expected 10000",
                  "Give the Trainer the whole validation set as eval_dataset; it shards and gathers it.")
    report.ok(f"it evaluated during training (eval_strategy): {len(records)} evaluation(s) in 1 epoch")
    acc = last.get("val_acc") or 0
    report.expect(acc > 0.85, f"validation accuracy {acc:.4f} after {last.get('steps')} steps",
                  f"validation accuracy {acc:.4f} after {last.get('steps')} steps, expected above 0.85",
                  "Use lesson 02's optimizer: optim=\"sgd\", learning_rate=args.lr (0.03) and "
                  "optim_args=f\"momentum={args.momentum}\"; the Trainer's default, AdamW at 5e-5, is tuned for "
                  "fine-tuning and barely moves this model (and a small MAX_STEPS trains less).")
    report.expect(judged is not None and abs(judged / 10000 - acc) <= 0.001,
                  f"the saved weights, evaluated by the check on this run's labels, score {(judged or 0) / 10000:.4f}",
                  f"the saved weights score {'nothing' if judged is None else f'{judged / 10000:.4f}'} on this "
                  f"run's labels, the Trainer logged {acc:.4f}",
                  "Train on the data the script is given (--data-dir), and keep the script's final save.")
    report.done()
