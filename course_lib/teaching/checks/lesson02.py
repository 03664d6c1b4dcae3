"""Checks of lesson 02 (DDP): exact distributed accuracy, a DDP training run with its checkpoint."""
from __future__ import annotations

import math
import re
from pathlib import Path
import torch

from .harness import Report, launch_script, rank_outputs, reported, run_harness, secret_seed


BATCH = 256  # the batch size the check passes to ``evaluate``


def shares(count: int, nproc: int, batch_size: int = BATCH) -> list[torch.Tensor]:
    """For each rank, which samples it may score: its share under a split that counts each sample once.

    Three splits are accepted: strided (``range(rank, N, world_size)``, the course's), contiguous blocks,
    and every ``world_size``-th batch. A sample outside all three of rank r's shares belongs to another rank.
    """
    index = torch.arange(count)
    block = torch.empty(count, dtype=torch.long)
    for r, part in enumerate(torch.tensor_split(index, nproc)):
        block[part] = r
    return [(index % nproc == r) | (block == r) | ((index // batch_size) % nproc == r) for r in range(nproc)]


def check_distributed_accuracy(script, nprocs=(2, 3)) -> None:
    """Task 02.1: ``evaluate`` (lesson 02's signature) counts every validation sample exactly once at any world size.

    The model's weights are secret, and so are the labels: rank r's ``val_set`` has the true label only in its
    own share (see ``shares``); elsewhere it has the class the model ranks last. So a rank that scores samples
    of another rank's share counts them wrong, and only a sharded evaluation whose counts are combined across
    ranks gets the numbers of one process over the whole set.
    """
    from course_lib.data import mnist_tensors
    from course_lib.model import MyModel

    report = Report("02.1", f"evaluate(model, val_set, rank, world_size, device, batch_size={BATCH}) at "
                    + " and ".join(f"{n}" for n in nprocs) + " processes")
    X, y = mnist_tensors(train=False)
    for nproc in nprocs:
        seed = secret_seed()  # the weights of the model evaluated: only the check knows them in advance
        torch.manual_seed(seed)
        model = MyModel().eval()
        with torch.no_grad():
            logits = torch.cat([model(X[i:i + 2000]) for i in range(0, len(y), 2000)])
        top3 = logits.topk(3, dim=1).indices == y[:, None]
        want_count = len(y)
        want_acc, want_acc3 = top3[:, 0].double().mean().item(), top3.any(dim=1).double().mean().item()
        labels = [torch.where(own, y, logits.argmin(1)) for own in shares(len(y), nproc)]
        whole = [(logits.argmax(1) == labels[r]).double().mean().item() for r in range(nproc)]
        print(f"  (a model only this check knows, in one process over all {want_count} samples: "
              f"top-1 {want_acc:.4f}, top-3 {want_acc3:.4f})")
        found = run_harness("02.1", script, f"""
            from torch.utils.data import TensorDataset
            from course_lib import MyModel, mnist_tensors

            torch.manual_seed(inputs["seed"])
            model = MyModel().eval()
            val_set = TensorDataset(mnist_tensors(train=False)[0], inputs["labels"])
            metrics = learner.evaluate(model, val_set, rank, world_size, torch.device("cpu"), {BATCH})
            if not isinstance(metrics, dict):
                raise TypeError(f"evaluate returned {{type(metrics).__name__}}, not the dict of val_acc, val_acc3, "
                                "val_correct and val_count")
            report(accuracy=float(metrics["val_acc"]), accuracy3=float(metrics["val_acc3"]),
                   correct=int(metrics["val_correct"]), count=int(metrics["val_count"]))
        """, nproc=nproc, inputs=[{"seed": seed, "labels": labels[r]} for r in range(nproc)])
        for rank, values in sorted(found.items()):
            count, acc, acc3, correct = (reported("02.1", rank, values, key)
                                         for key in ("count", "accuracy", "accuracy3", "correct"))
            where = f"{nproc} processes, rank {rank}"
            if count == want_count:
                report.ok(f"{where}: count = {count}")
            elif count == math.ceil(want_count / nproc) * nproc:
                report.fail(f"{where}: count = {count}, {count - want_count} padded sample(s) counted twice",
                            "DistributedSampler repeats samples so every rank gets the same number; "
                            "shard the indices yourself so each sample belongs to exactly one rank.")
            elif count < want_count:
                report.fail(f"{where}: count = {count}, only part of the {want_count} samples",
                            "Each rank sees only its shard: combine the counts of all ranks.")
            else:
                report.fail(f"{where}: count = {count}, expected {want_count}")
            scored_all = abs(acc - want_acc) >= 6e-4 and min(
                abs(acc - whole[rank]), abs(acc - sum(whole) / nproc)) < 6e-4
            report.expect(abs(acc - want_acc) < 6e-4, f"{where}: accuracy {acc:.4f}",
                          f"{where}: accuracy {acc:.4f}, expected {want_acc:.4f}",
                          "Every rank scored the whole val_set. This check gives each rank labels that are right "
                          "only in its own share, as if the ranks held different data: rank r scores "
                          "range(rank, len(val_set), world_size) only, and the ranks combine their counts."
                          if scored_all else
                          "Accuracy = all correct predictions / all samples, summed over ranks before dividing "
                          "(an average of per-batch or per-rank accuracies is biased).")
            report.expect(abs(acc3 - want_acc3) < 6e-4, f"{where}: top-3 {acc3:.4f}",
                          f"{where}: top-3 {acc3:.4f}, expected {want_acc3:.4f}",
                          "Top-3: the label is among the 3 largest outputs (topk(3)); count those like the top-1 hits.")
            report.expect(correct == round(acc * count), f"{where}: val_correct = {correct}",
                          f"{where}: val_correct = {correct}, but val_acc x val_count = {acc * count:.1f}",
                          "val_correct is the number of correct top-1 predictions over all ranks.")
    report.done()


def check_ddp_training(script, nproc: int = 2, max_steps: int | None = None) -> None:
    """Task 02.2: DDP training: disjoint shards, identical weights on every rank, a loadable checkpoint."""
    from course_lib.data import mnist_tensors
    from course_lib.model import MyModel

    steps = "the whole epoch" if max_steps is None else f"{max_steps} steps"
    report = Report("02.2", f"DDP training on {nproc} processes, one epoch ({steps})")
    script = Path(script)
    checkpoint = script.parent / "checkpoints" / "checkpoint-0.pt"
    checkpoint.unlink(missing_ok=True)  # only this run's checkpoint counts
    script_args = ["--epochs", "1"] + ([] if max_steps is None else ["--max-steps", str(max_steps)])
    result = launch_script("02.2", script, nproc=nproc, script_args=script_args)
    epochs = result.events("epoch")
    if not epochs:
        report.stop("the script logged no `epoch` metrics", "Keep the log_metrics call of the script as given.")
    last = epochs[-1]
    outputs = rank_outputs(result)
    shard = re.search(r"(\d+) training samples, (\d+) per rank", outputs.get(0, ""))
    if shard is None:
        report.fail("rank 0 printed no line `N training samples, M per rank, ...` (keep that print of the script)")
    else:
        total, per_rank = int(shard[1]), int(shard[2])
        if per_rank == math.ceil(total / nproc):
            report.ok(f"each rank trains on its own shard: {per_rank} of the {total} samples")
        elif per_rank == total:
            report.fail(f"every rank trains on all {total} samples",
                        "Give the training DataLoader a DistributedSampler that hands each rank its own shard.")
        else:
            report.fail(f"each rank's sampler holds {per_rank} of {total} samples, expected {math.ceil(total / nproc)}",
                        "DistributedSampler needs num_replicas=world_size and this process's rank.")
    sums = {}
    for rank in range(nproc):
        found = re.findall(r"parameter checksum ([-\d.e+]+)", outputs.get(rank, ""))
        if found:
            sums[rank] = float(found[-1])
    if len(sums) == nproc and len(set(sums.values())) == 1:
        report.ok(f"all {nproc} ranks end with identical weights (checksum {sums[0]:.6f})")
    elif len(sums) == nproc:
        report.fail(f"the ranks end with different weights: {sums}",
                    "Without gradient synchronisation each rank trains its own model: wrap the model for DDP.")
    else:
        report.fail("not every rank printed its `parameter checksum` line (keep the checksum region of the script)")
    acc = last.get("val_acc")
    if acc is None:
        report.stop("the epoch metrics have no `val_acc`", "Keep the log_metrics call of the script as given.")
    report.expect(acc > 0.85, f"validation accuracy {acc:.4f} after one epoch",
                  f"validation accuracy {acc:.4f} after one epoch, expected above 0.85",
                  "Check the learning rate and that every rank steps its optimizer after backward.")
    if not checkpoint.is_file():
        report.stop(f"no checkpoint at {checkpoint}",
                    "Rank 0 saves after the epoch, in save_checkpoint, at the path the script passes it.")
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as exc:
        report.stop(f"{checkpoint} does not load with weights_only=True ({type(exc).__name__}: {exc})",
                    "Save plain tensors and numbers in a dict: state_dicts and the epoch.")
    missing = {"model", "optimizer", "epoch"} - set(state) if isinstance(state, dict) else {"model", "optimizer", "epoch"}
    if missing:
        report.stop(f"the checkpoint lacks the key(s) {sorted(missing)}",
                    "Save a dict with 'model', 'optimizer' and 'epoch'.")
    report.ok("the checkpoint loads with weights_only=True and has model, optimizer and epoch")
    keys = list(state["model"])
    if any(k.startswith("module.") for k in keys):
        report.stop("the checkpoint's model keys start with `module.`: they do not load into a plain MyModel",
                    "Save the state_dict of the model inside the DDP wrapper (`model`), not of the wrapper.")
    model = MyModel()
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        report.stop(f"the checkpoint's model does not load into MyModel: {str(exc)[:300]}")
    X, y = mnist_tensors(train=False)
    with torch.no_grad():
        own = (model.eval()(X).argmax(1) == y).float().mean().item()
    report.expect(abs(own - acc) < 2e-3,
                  f"the checkpoint's weights reproduce the logged accuracy ({own:.4f})",
                  f"the checkpoint's weights give accuracy {own:.4f}, the run logged {acc}",
                  "Save after training, the weights the run evaluated.")
    report.done()
