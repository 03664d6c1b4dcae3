"""The checks that follow each exercise: what is right, what is wrong, and a hint.

Used by ``solutions/`` and ``exercises/``. A check tests behaviour: it launches the learner's script
on 2 (or 3) processes and inspects what came out (each rank's output, metrics, checkpoints), or it
calls the learner's function with cases whose answers it knows. It never reads the learner's source.
A failed check raises ``CheckFailed`` (an ``AssertionError``); a task whose code still raises
``NotImplementedError`` raises ``NotAttempted`` (both a ``CheckFailed`` and a ``NotImplementedError``),
which is how the grader tells "not attempted" from "wrong".
"""
from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

import torch

#: Seconds a check lets a launched script run before stopping it (a hang is reported as a failure).
LAUNCH_TIMEOUT = 240
RESULT_PREFIX = "CHECK-RESULT "


class CheckFailed(AssertionError):
    """The task's code runs but does not do what the task asks; the message says what and gives a hint."""


class NotAttempted(CheckFailed, NotImplementedError):
    """The task's code still raises the exercise's ``NotImplementedError``."""


class Report:
    """Collects the findings of one check, prints them as they come, raises at the end if any failed."""

    def __init__(self, task: str, title: str):
        self.task, self.failures, self.hints = task, [], []
        print(f"Checking task {task}: {title}")

    def ok(self, message: str) -> None:
        print(f"  \u2714 {message}")

    def fail(self, message: str, hint: str | None = None) -> None:
        print(f"  \u2718 {message}")
        self.failures.append(message)
        if hint and hint not in self.hints:
            self.hints.append(hint)

    def expect(self, condition: bool, good: str, bad: str, hint: str | None = None) -> bool:
        (self.ok(good) if condition else self.fail(bad, hint))
        return bool(condition)

    def stop(self, message: str, hint: str | None = None) -> None:
        """A finding after which nothing else can be checked."""
        self.fail(message, hint)
        self.done()

    def done(self) -> None:
        if not self.failures:
            print(f"Task {self.task} passed.")
            return
        for hint in self.hints:
            print(f"  Hint: {hint}")
        message = f"Task {self.task}: " + "; ".join(self.failures)
        if self.hints:
            message += ". Hint: " + " ".join(self.hints)
        raise CheckFailed(message)


def not_attempted(task: str, where: str) -> NotAttempted:
    return NotAttempted(f"Task {task} is not attempted yet: {where} still raises NotImplementedError. "
                        "Replace the `raise NotImplementedError(...)` line with your code, run that cell, "
                        "then run the check again.")


def _call(task: str, fn, *args, **kwargs):
    """Call the learner's function; its NotImplementedError means 'not attempted'."""
    if not callable(fn):
        raise CheckFailed(f"Task {task}: expected a function, got {fn!r}. Pass the function itself (no parentheses).")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        name = getattr(fn, "__qualname__", None) or type(fn).__name__  # a function, a method or a model
        raise not_attempted(task, f"`{name}`") from None


# --- launching the learner's scripts -------------------------------------------------------------


def _launch(task: str, script, nproc: int = 2, script_args=(), timeout: float = LAUNCH_TIMEOUT,
            max_restarts: int = 0, env: dict | None = None, allow_failure: bool = False):
    """Run ``script`` with torchrun; a missing script, a hang or a failing rank becomes a clear CheckFailed.

    ``allow_failure``: a failing run is returned (unless it failed on the exercise's NotImplementedError).
    """
    from .launch import LaunchTimeout, failure_message, torchrun

    script = Path(script)
    if not script.is_file():
        raise CheckFailed(f"Task {task}: there is no script at {script}. Run the cell that writes it "
                          "(the one starting with %%write_script) first, then this check.")
    print(f"Launching {script} on {nproc} processes:")
    try:
        result = torchrun(script, nproc=nproc, script_args=script_args, timeout=timeout, check=False,
                          max_restarts=max_restarts, env=env)
    except LaunchTimeout:
        raise CheckFailed(
            f"Task {task}: {script} did not finish within {timeout:.0f}s on {nproc} processes and was stopped. "
            "Usually one rank waits in a collective (all_reduce, broadcast, barrier) that another rank "
            "never calls, e.g. a collective inside `if rank == 0:`.") from None
    if not result.ok:
        everything = result.launcher_output + "\n" + "\n".join(rank_outputs(result).values())
        if "NotImplementedError" in everything:
            raise not_attempted(task, f"the script {script}")
        if allow_failure:
            return result
        details = failure_message(result)
        if len(details) > 4000:
            details = "...\n" + details[-4000:]
        raise CheckFailed(f"Task {task}: {script} failed on {nproc} processes.\n{details}")
    return result


def rank_outputs(result) -> dict[int, str]:
    """Each rank's whole output, read from torchrun's per-rank log files when they hold more.

    The streamed ``result.outputs`` can miss the last lines of a rank that exits right after printing
    (torchrun's tee may stop before it reads them); the log files under ``--log-dir`` have everything.
    """
    outputs = dict(result.outputs)
    command = list(result.command)
    if "--log-dir" not in command:
        return outputs
    log_dir = Path(command[command.index("--log-dir") + 1])
    runs = sorted((d for d in log_dir.glob("*") if d.is_dir()), key=lambda d: d.stat().st_mtime)
    if not runs:
        return outputs
    from_files: dict[int, str] = {}
    for attempt in sorted(runs[-1].glob("attempt_*"), key=lambda d: int(d.name.split("_")[-1])):
        for rank_dir in sorted(p for p in attempt.iterdir() if p.name.isdigit()):
            text = "".join((rank_dir / name).read_text(errors="replace")
                           for name in ("stdout.log", "stderr.log") if (rank_dir / name).is_file())
            from_files[int(rank_dir.name)] = from_files.get(int(rank_dir.name), "") + text
    for rank, text in from_files.items():
        if len(text) > len(outputs.get(rank, "")):
            outputs[rank] = text
    return outputs


def rank_results(result) -> dict[int, dict]:
    """The ``CHECK-RESULT {json}`` line each rank printed (the harness's report), by rank."""
    found = {}
    for rank, text in rank_outputs(result).items():
        for line in text.splitlines():
            if line.startswith(RESULT_PREFIX):
                found[rank] = json.loads(line[len(RESULT_PREFIX):])
    return found


_HARNESS = '''\
"""Written by course_lib.checks for task {task}: calls your code in {learner} on every rank.

Launch: torchrun --standalone --nproc-per-node 2 {this}
"""
import importlib.util
import json

import torch
import torch.distributed as dist


def load_learner_module(path):
    spec = importlib.util.spec_from_file_location("learner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its `if __name__ == "__main__":` part does not run
    return module


def report(**values):
    print({prefix!r} + json.dumps(values), flush=True)


learner = load_learner_module({learner_path!r})
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
try:
{body}
finally:
    dist.destroy_process_group()
'''


def _harness(task: str, learner_script, body: str, nproc: int = 2) -> dict[int, dict]:
    """Launch a small script that imports the learner's file and runs ``body`` on every rank."""
    learner_script = Path(learner_script)
    if not learner_script.is_file():
        raise CheckFailed(f"Task {task}: there is no file {learner_script}. Run the cell that writes it "
                          "(the one starting with %%write_script) first, then this check.")
    harness = learner_script.with_name(f"_check_{learner_script.stem}.py")
    text = _HARNESS.format(task=task, learner=learner_script.name, learner_path=str(learner_script.resolve()),
                           this=harness.as_posix(), prefix=RESULT_PREFIX,
                           body=textwrap.indent(textwrap.dedent(body).strip("\n"), "    "))
    harness.write_text(text)
    result = _launch(task, harness, nproc=nproc)
    found = rank_results(result)
    missing = sorted(set(range(nproc)) - set(found))
    if missing:
        outputs = rank_outputs(result)
        raise CheckFailed(f"Task {task}: rank(s) {missing} reported no result. Their output:\n"
                          + "\n".join(outputs.get(r, "")[-1000:] for r in missing))
    return found


# --- lesson 00: processes, ranks, backends --------------------------------------------------------


def check_hello_ranks(script, nproc: int = 2) -> None:
    """Task 00.1: every rank prints ``rank R of W`` with its own rank and the world size."""
    report = Report("00.1", f"each of {nproc} processes prints `rank R of {nproc}`")
    outputs = rank_outputs(_launch("00.1", script, nproc=nproc))
    pattern = re.compile(r"\brank (\d+) of (\d+)\b")
    for rank in range(nproc):
        said = pattern.findall(outputs.get(rank, ""))
        if not said:
            report.fail(f"rank {rank} printed no line like `rank {rank} of {nproc}`",
                        "torchrun gives every process its rank and the world size in environment variables.")
        elif (str(rank), str(nproc)) in said:
            report.ok(f"rank {rank} printed `rank {rank} of {nproc}`")
        else:
            r, w = said[0]
            report.fail(f"rank {rank} printed `rank {r} of {w}`; it should say `rank {rank} of {nproc}`",
                        "Read the values torchrun set for this process (not a constant, not LOCAL_RANK only).")
    report.done()


def check_pick_backend(pick_backend) -> None:
    """Task 00.2: nccl only when CUDA works and every local rank has its own GPU, else gloo."""
    report = Report("00.2", "pick_backend(cuda_available, gpu_count, local_world_size)")
    cases = [
        ((False, 0, 2), "gloo", "a laptop without GPUs"),
        ((True, 4, 4), "nccl", "4 GPUs for 4 local processes"),
        ((True, 8, 2), "nccl", "8 GPUs for 2 local processes"),
        ((True, 1, 2), "gloo", "1 GPU for 2 local processes (NCCL would need one GPU per rank)"),
        ((False, 2, 2), "gloo", "a CUDA build that cannot use its GPUs (cuda_available=False)"),
    ]
    for args, expected, story in cases:
        got = _call("00.2", pick_backend, *args)
        report.expect(got == expected, f"{story}: {got!r}",
                      f"{story}: returned {got!r}, expected {expected!r}",
                      "nccl needs CUDA *and* one GPU per local rank; everything else runs on gloo.")
    report.done()


def check_all_reduce_script(script, nproc: int = 2) -> None:
    """Task 00.3: each rank joins the group, all-reduces ``rank + 1`` and prints the sum."""
    report = Report("00.3", f"all_reduce of rank + 1 over {nproc} processes")
    outputs = rank_outputs(_launch("00.3", script, nproc=nproc))
    expected = nproc * (nproc + 1) // 2
    pattern = re.compile(r"\bsum = (-?\d+(?:\.\d+)?)")
    for rank in range(nproc):
        said = pattern.findall(outputs.get(rank, ""))
        if not said:
            report.fail(f"rank {rank} printed no `sum = ...` line",
                        "Print the tensor's value after the all_reduce, e.g. `sum = 3`.")
            continue
        value = float(said[-1])
        if value == expected:
            report.ok(f"rank {rank} got sum = {expected:g}")
        elif value == rank + 1:
            report.fail(f"rank {rank} printed its own value {value:g}, not the sum {expected}",
                        "all_reduce changes the tensor in place on every rank; print it after the call.")
        else:
            report.fail(f"rank {rank} printed sum = {value:g}, expected {expected}",
                        "Each rank contributes rank + 1; the default reduction is a sum.")
    backends = [m for r in range(nproc) for m in re.findall(r"backend[ =:]+(\w+)", outputs.get(r, ""))]
    report.expect(bool(backends) and set(backends) <= {"gloo", "nccl"},
                  f"the backend was printed: {sorted(set(backends))}",
                  "no rank printed `backend = gloo` (or nccl)",
                  "Print dist.get_backend() after init_process_group, so the reader knows which was used.")
    report.done()


# --- lesson 01: collectives ----------------------------------------------------------------------


def check_average_gradients(script, nproc: int = 2) -> None:
    """Task 01.1: after ``average_gradients(model)`` every rank holds the gradient of the whole batch."""
    report = Report("01.1", f"average_gradients on {nproc} processes equals the whole batch's gradient")
    found = _harness("01.1", script, """
        import torch.nn.functional as F
        from course_lib import MyModel

        torch.manual_seed(0)
        X, y = torch.randn(12, 1, 28, 28), torch.randint(0, 10, (12,))
        def fresh_model():
            torch.manual_seed(1)
            return MyModel().eval()  # eval: BatchNorm's running statistics, so shard losses add up exactly
        reference = fresh_model()
        F.cross_entropy(reference(X), y).backward()
        model = fresh_model()
        F.cross_entropy(model(X[rank::world_size]), y[rank::world_size]).backward()
        learner.average_gradients(model)
        got = torch.cat([p.grad.flatten() for p in model.parameters()])
        want = torch.cat([p.grad.flatten() for p in reference.parameters()])
        report(max_diff=(got - want).abs().max().item(), ratio=(got @ want / (want @ want)).item())
    """, nproc=nproc)
    for rank, values in sorted(found.items()):
        diff, ratio = values["max_diff"], values["ratio"]
        if diff < 1e-5:
            report.ok(f"rank {rank}: gradients match the whole batch's (max difference {diff:.1e})")
        elif abs(ratio - nproc) < 1e-3:
            report.fail(f"rank {rank}: gradients are {nproc}x the whole batch's",
                        "The all-reduce sums; an average also divides by the world size.")
        else:
            report.fail(f"rank {rank}: gradients differ from the whole batch's by up to {diff:.2e}",
                        "Every parameter's .grad must be combined across all ranks, in place.")
    report.done()


def check_global_mean(script, nproc: int = 3) -> None:
    """Task 01.2: the mean over every rank's values, when ranks hold different numbers of values."""
    report = Report("01.2", f"global_mean over {nproc} processes holding 1, 2, 3, ... values")
    found = _harness("01.2", script, """
        start = rank * (rank + 1) // 2
        values = torch.arange(start, start + rank + 1, dtype=torch.float32) ** 2
        report(mean=float(learner.global_mean(values)))
    """, nproc=nproc)
    everything = [float(i * i) for i in range(nproc * (nproc + 1) // 2)]
    expected = sum(everything) / len(everything)
    shards, start = [], 0
    for rank in range(nproc):
        shards.append(everything[start:start + rank + 1])
        start += rank + 1
    mean_of_means = sum(sum(s) / len(s) for s in shards) / nproc
    for rank, values in sorted(found.items()):
        got = values["mean"]
        if math.isclose(got, expected, rel_tol=1e-5):
            report.ok(f"rank {rank}: {got:.4f} (the mean of all {len(everything)} values)")
        elif math.isclose(got, mean_of_means, rel_tol=1e-5):
            report.fail(f"rank {rank}: {got:.4f} is the mean of the ranks' means, not of all values ({expected:.4f})",
                        "Ranks hold different numbers of values: combine sums and counts, divide at the end.")
        else:
            report.fail(f"rank {rank}: {got:.4f}, expected {expected:.4f}",
                        "Every rank must return the same number: the sum of all values over the count of all values.")
    report.done()


def check_broadcast_model(script, nproc: int = 2) -> None:
    """Task 01.3: after ``broadcast_model(model)`` every rank holds rank 0's parameters and buffers."""
    report = Report("01.3", f"broadcast_model on {nproc} processes gives every rank rank 0's weights")
    found = _harness("01.3", script, """
        from course_lib import MyModel

        torch.manual_seed(rank)  # every rank starts from different weights...
        model = MyModel()
        model.norm.running_mean.fill_(float(rank))  # ...and different buffers
        learner.broadcast_model(model)
        torch.manual_seed(0)
        expected = MyModel()
        expected.norm.running_mean.fill_(0.0)
        diffs = {k: (v.float() - expected.state_dict()[k].float()).abs().max().item()
                 for k, v in model.state_dict().items()}
        report(params=max(diffs[k] for k, _ in model.named_parameters()),
               buffers=max(diffs[k] for k, _ in model.named_buffers()))
    """, nproc=nproc)
    for rank, values in sorted(found.items()):
        report.expect(values["params"] == 0, f"rank {rank}: parameters equal rank 0's",
                      f"rank {rank}: parameters differ from rank 0's by up to {values['params']:.3g}",
                      "Every rank must call the collective for every tensor, with rank 0 as the source.")
        report.expect(values["buffers"] == 0, f"rank {rank}: buffers (BatchNorm statistics) equal rank 0's",
                      f"rank {rank}: buffers differ from rank 0's by up to {values['buffers']:.3g}",
                      "Buffers are not parameters: model.state_dict() holds both.")
    report.done()


# --- lesson 02: DDP -----------------------------------------------------------------------------


def _reference_accuracy(seed: int = 0) -> tuple[float, int]:
    """Top-1 of an untrained ``MyModel`` (seeded) over the whole validation set, in one process."""
    from .data import mnist_tensors
    from .model import MyModel

    X, y = mnist_tensors(train=False)
    torch.manual_seed(seed)
    model = MyModel().eval()
    with torch.no_grad():
        correct = sum((model(X[i:i + 2000]).argmax(1) == y[i:i + 2000]).sum().item() for i in range(0, len(y), 2000))
    return correct / len(y), len(y)


def _reference_top3(seed: int = 0) -> float:
    """Top-3 accuracy of the untrained ``MyModel`` of ``_reference_accuracy``, in one process."""
    from .data import mnist_tensors
    from .model import MyModel

    X, y = mnist_tensors(train=False)
    torch.manual_seed(seed)
    model = MyModel().eval()
    with torch.no_grad():
        hits = sum((model(X[i:i + 2000]).topk(3, dim=1).indices == y[i:i + 2000, None]).any(dim=1).sum().item()
                   for i in range(0, len(y), 2000))
    return hits / len(y)


def check_distributed_accuracy(script, nprocs=(2, 3)) -> None:
    """Task 02.1: ``evaluate`` (lesson 02's signature) counts every validation sample exactly once at any world size."""
    report = Report("02.1", "evaluate(model, val_set, rank, world_size, device, batch_size) at "
                    + " and ".join(f"{n}" for n in nprocs) + " processes")
    want_acc, want_count = _reference_accuracy()
    want_acc3 = _reference_top3()
    print(f"  (one process over all {want_count} samples: top-1 {want_acc:.4f}, top-3 {want_acc3:.4f})")
    for nproc in nprocs:
        found = _harness("02.1", script, """
            from torch.utils.data import TensorDataset
            from course_lib import MyModel, mnist_tensors

            torch.manual_seed(0)
            model = MyModel().eval()
            val_set = TensorDataset(*mnist_tensors(train=False))
            metrics = learner.evaluate(model, val_set, rank, world_size, torch.device("cpu"), 256)
            if not isinstance(metrics, dict):
                raise TypeError(f"evaluate returned {type(metrics).__name__}, not the dict of val_acc, val_acc3, "
                                "val_correct and val_count")
            report(accuracy=float(metrics["val_acc"]), accuracy3=float(metrics["val_acc3"]),
                   correct=int(metrics["val_correct"]), count=int(metrics["val_count"]))
        """, nproc=nproc)
        for rank, values in sorted(found.items()):
            count, acc = values["count"], values["accuracy"]
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
            report.expect(abs(acc - want_acc) < 6e-4, f"{where}: accuracy {acc:.4f}",
                          f"{where}: accuracy {acc:.4f}, expected {want_acc:.4f}",
                          "Accuracy = all correct predictions / all samples, summed over ranks before dividing "
                          "(an average of per-batch or per-rank accuracies is biased).")
            report.expect(abs(values["accuracy3"] - want_acc3) < 6e-4, f"{where}: top-3 {values['accuracy3']:.4f}",
                          f"{where}: top-3 {values['accuracy3']:.4f}, expected {want_acc3:.4f}",
                          "Top-3: the label is among the 3 largest outputs (topk(3)); count those like the top-1 hits.")
            report.expect(values["correct"] == round(acc * count), f"{where}: val_correct = {values['correct']}",
                          f"{where}: val_correct = {values['correct']}, but val_acc x val_count = {acc * count:.1f}",
                          "val_correct is the number of correct top-1 predictions over all ranks.")
    report.done()


def check_ddp_training(script, nproc: int = 2, max_steps: int | None = None) -> None:
    """Task 02.2: DDP training: disjoint shards, identical weights on every rank, a loadable checkpoint."""
    from .data import mnist_tensors
    from .model import MyModel

    steps = "the whole epoch" if max_steps is None else f"{max_steps} steps"
    report = Report("02.2", f"DDP training on {nproc} processes, one epoch ({steps})")
    script = Path(script)
    checkpoint = script.parent / "checkpoints" / "checkpoint-0.pt"
    checkpoint.unlink(missing_ok=True)  # only this run's checkpoint counts
    script_args = ["--epochs", "1"] + ([] if max_steps is None else ["--max-steps", str(max_steps)])
    result = _launch("02.2", script, nproc=nproc, script_args=script_args)
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


# --- lesson 03: the seed's defects ----------------------------------------------------------------


def check_batch_of_one(model_class) -> None:
    """Task 03.1: the model's output is (N, 10) for every N, one sample included."""
    import torch.nn.functional as F

    from .model import MyModel

    report = Report("03.1", "the seed's model on a batch of one sample")
    torch.manual_seed(0)
    reference = MyModel().eval()
    model = _call("03.1", model_class)
    try:
        model.load_state_dict(reference.state_dict())
    except (RuntimeError, AttributeError) as exc:
        report.stop(f"the model's layers changed, so the seed's weights no longer load: {str(exc)[:200]}",
                    "Keep conv, norm and head as they are; only the end of forward() needs the fix.")
    model.eval()
    X = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        for n in (5, 1):
            out = _call("03.1", model, X[:n])
            if tuple(out.shape) != (n, 10):
                report.fail(f"a batch of {n} gives shape {tuple(out.shape)}, expected ({n}, 10)",
                            "squeeze() drops every dimension of size 1, the batch dimension too when N == 1; "
                            "drop only the two spatial dimensions.")
                continue
            diff = (out - reference(X[:n])).abs().max().item()
            report.expect(diff < 1e-5, f"a batch of {n} gives shape ({n}, 10) and the seed's values",
                          f"a batch of {n} gives values that differ from the seed model's by {diff:.2e}",
                          "Change only the shape of the output, not the computation.")
        out = model(X[:1])
        if tuple(out.shape) == (1, 10):
            loss = F.cross_entropy(out, torch.tensor([3]))
            report.ok(f"cross_entropy on a batch of one works (loss {loss.item():.3f})")
    report.done()


class _RunsCodeWhenLoaded:
    """Unpickling this creates a file: what any code in a malicious checkpoint could do instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def check_load_model(load_model) -> None:
    """Task 03.2: load the seed's DDP checkpoint and the course's checkpoint; refuse pickled code."""
    import tempfile

    from .model import MyModel

    report = Report("03.2", "load_model(path) for the seed's and the course's checkpoints")
    torch.manual_seed(7)
    trained = MyModel()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = {
            "the seed's checkpoint (state_dict of the DDP wrapper)":
                ({f"module.{k}": v for k, v in trained.state_dict().items()}, tmp / "checkpoint-9.pt"),
            "the course's checkpoint ({'model': ..., 'optimizer': ..., 'epoch': ...})":
                ({"model": trained.state_dict(), "optimizer": {"state": {}, "param_groups": []}, "epoch": 9},
                 tmp / "last.pt"),
        }
        for story, (content, path) in files.items():
            torch.save(content, path)
            try:
                model = _call("03.2", load_model, path)
            except NotAttempted:
                raise
            except Exception as exc:
                report.fail(f"{story}: load_model raised {type(exc).__name__}: {str(exc)[:300]}",
                            "DDP's state_dict names every tensor `module.<name>`; MyModel expects `<name>`.")
                continue
            if not isinstance(model, torch.nn.Module):
                report.fail(f"{story}: load_model returned {type(model).__name__}, expected a MyModel")
                continue
            same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
            report.expect(same and set(model.state_dict()) == set(trained.state_dict()),
                          f"{story}: loaded, weights identical", f"{story}: loaded, but the weights differ",
                          "Load every tensor of the file into a fresh MyModel.")
        evil, marker = tmp / "evil.pt", tmp / "code-ran-here"
        torch.save({"model": _RunsCodeWhenLoaded(marker)}, evil)
        try:
            _call("03.2", load_model, evil)
            refused = False
        except NotAttempted:
            raise
        except Exception:
            refused = True
        report.expect(not marker.exists(), "a checkpoint carrying code did not run it",
                      "loading a checkpoint that carries code RAN that code (it created a file)",
                      "torch.load unpickles arbitrary objects unless told to accept only tensors and plain data.")
        report.expect(refused, "that checkpoint was refused with an error",
                      "load_model accepted a checkpoint that is not a plain dict of tensors")
    report.done()


def check_rank0_evaluation(script, nproc: int = 2, epochs: int = 2, max_steps: int = 30) -> None:
    """Task 03.3: rank 0 evaluates every epoch without calling DDP's forward alone; nothing hangs."""
    report = Report("03.3", f"{epochs} epochs of {max_steps} steps on {nproc} processes with rank-0 evaluation")
    try:
        result = _launch("03.3", script, nproc=nproc, timeout=150,
                         script_args=["--epochs", str(epochs), "--max-steps", str(max_steps)])
    except NotAttempted:
        raise
    except CheckFailed as exc:  # the seed's bug ends in a crash or a hang; say why
        raise CheckFailed(f"{exc}\nHint: DDP's forward is itself a collective (it broadcasts BatchNorm buffers "
                          "from rank 0); rank 0 alone must not call it.") from None
    report.ok(f"the run finished on {nproc} processes in {result.duration:.0f}s (no hang, no crash)")
    epochs_logged = [m.get("epoch") for m in result.events("epoch")]
    report.expect(epochs_logged == list(range(epochs)), f"rank 0 evaluated after every epoch: {epochs_logged}",
                  f"evaluations logged for epochs {epochs_logged}, expected {list(range(epochs))}")
    counts = {m.get("val_count") for m in result.events("epoch")}
    accs = [m.get("val_acc") or 0 for m in result.events("epoch")]
    report.expect(counts == {10000}, "each evaluation covered all 10000 validation samples",
                  f"evaluations covered {sorted(c for c in counts if c is not None)} samples, expected 10000")
    report.expect(bool(accs) and accs[-1] > 0.85, f"final accuracy {accs[-1] if accs else 0:.4f}",
                  f"final accuracy {accs[-1] if accs else 0:.4f}, expected above 0.85")
    outputs = rank_outputs(result)
    sums = {r: re.findall(r"parameter checksum ([-\d.e+]+)", outputs.get(r, "")) for r in range(nproc)}
    same = all(sums.values()) and len({s[-1] for s in sums.values()}) == 1
    report.expect(same, "every rank ends with the same weights",
                  "the ranks end with different weights: a collective was paired with the wrong one",
                  "DDP's forward is itself a collective (it broadcasts BatchNorm buffers): "
                  "a forward that only rank 0 runs must not go through the wrapper.")
    report.done()


# --- lesson 04: checkpoints for elastic restarts ----------------------------------------------------


class _Wrapped(torch.nn.Module):
    """Names its tensors like DDP does (``module.<name>``), without needing a process group."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


class _OptimizerThatFailsToSave:
    """An optimizer whose state cannot be pickled: torch.save fails half-way through writing."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def state_dict(self):
        state = self.optimizer.state_dict()
        state["not_picklable"] = lambda: None
        return state


def check_checkpoints(save_checkpoint, load_checkpoint) -> None:
    """Task 04.1: save/load a checkpoint: unwrapped weights, optimizer, epoch; atomic; resume epoch."""
    import tempfile

    import torch.nn.functional as F

    from .model import MyModel

    report = Report("04.1", "save_checkpoint / load_checkpoint")

    def trained_pair(seed):
        torch.manual_seed(seed)
        model = MyModel()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        X, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
        F.cross_entropy(model(X), y).backward()
        optimizer.step()  # now the optimizer has momentum buffers worth saving
        return model, optimizer

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "checkpoints"
        folder.mkdir()
        path = folder / "checkpoint-4.pt"
        model, optimizer = trained_pair(0)
        _call("04.1", save_checkpoint, path, _Wrapped(model), optimizer, 4)
        if not path.is_file():
            report.stop("save_checkpoint(path, ...) wrote no file at path", "Write the checkpoint to the path given.")
        others = sorted(p.name for p in folder.iterdir() if p != path)
        report.expect(not others, "save_checkpoint left no other file behind",
                      f"save_checkpoint left other files in the folder: {others}",
                      "A temporary file must be renamed onto the target (os.replace), not left behind.")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            report.stop(f"the checkpoint does not load with weights_only=True ({type(exc).__name__})",
                        "Save a dict of state_dicts and numbers only.")
        keys = set(state) if isinstance(state, dict) else set()
        if not {"model", "optimizer", "epoch"} <= keys:
            report.stop(f"the checkpoint has keys {sorted(keys)}, expected model, optimizer and epoch")
        prefixed = [k for k in state["model"] if k.startswith("module.")]
        report.expect(not prefixed, "the model's keys have no `module.` prefix (saved unwrapped)",
                      f"the model's keys start with `module.` ({', '.join(prefixed[:2])}, ...)",
                      "The model passed in may be wrapped (DDP): save the state_dict of the model inside it.")
        fresh, fresh_optimizer = trained_pair(1)
        start = _call("04.1", load_checkpoint, path, _Wrapped(fresh), fresh_optimizer)
        report.expect(start == 5, "load_checkpoint returns 5 for a checkpoint of epoch 4 (the next epoch to run)",
                      f"load_checkpoint returned {start!r} for a checkpoint taken after epoch 4, expected 5",
                      "Return the epoch to start from: the one after the saved epoch.")
        same = all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
        report.expect(same, "the weights are restored", "the weights were not restored into the model")
        momentum = [s.get("momentum_buffer") for s in fresh_optimizer.state.values()]
        wanted = [s.get("momentum_buffer") for s in optimizer.state.values()]
        restored = len(momentum) == len(wanted) and all(
            a is not None and b is not None and torch.equal(a, b) for a, b in zip(momentum, wanted))
        report.expect(restored, "the optimizer's momentum is restored",
                      "the optimizer's state (momentum buffers) was not restored",
                      "Without the optimizer's state, training resumes with a different optimizer than it stopped with.")
        untouched, untouched_optimizer = trained_pair(2)
        before = [t.clone() for t in untouched.state_dict().values()]
        start = _call("04.1", load_checkpoint, folder / "checkpoint-9.pt", untouched, untouched_optimizer)
        report.expect(start == 0 and all(torch.equal(a, b) for a, b in zip(before, untouched.state_dict().values())),
                      "with no checkpoint yet, load_checkpoint returns 0 and leaves the model alone",
                      f"with no checkpoint file, load_checkpoint returned {start!r} (expected 0) or changed the model",
                      "The first attempt of a job has no checkpoint: start from epoch 0.")
        try:
            save_checkpoint(path, _Wrapped(model), _OptimizerThatFailsToSave(optimizer), 5)
        except NotImplementedError:
            raise not_attempted("04.1", "`save_checkpoint`") from None
        except Exception:
            pass  # expected: this optimizer cannot be saved
        try:
            survived = torch.load(path, map_location="cpu", weights_only=True)["epoch"] == 4
        except Exception:
            survived = False
        report.expect(survived, "a save that fails half-way leaves the previous checkpoint intact",
                      "a save that failed half-way destroyed the previous checkpoint",
                      "Write to a temporary file in the same folder, then rename it onto the target (os.replace).")
    report.done()


def check_elastic_resume(script, nproc: int = 2, epochs: int = 3, fail_at_epoch: int = 1,
                         max_steps: int = 8) -> None:
    """Task 04.2: a job that crashed at ``fail_at_epoch`` resumes from its newest checkpoint when started again."""
    import shutil

    report = Report("04.2", f"a crash at epoch {fail_at_epoch}, then the job started again")
    script = Path(script)
    checkpoints = script.parent / "checkpoints"
    shutil.rmtree(checkpoints, ignore_errors=True)  # a fresh job: no checkpoint from an earlier run
    args = ["--epochs", str(epochs), "--max-steps", str(max_steps)]
    print("First attempt, with a crash:")
    crashed = _launch("04.2", script, nproc=nproc, script_args=args + ["--fail-at-epoch", str(fail_at_epoch)],
                      allow_failure=True)
    if crashed.ok or "simulated crash" not in "\n".join(rank_outputs(crashed).values()):
        report.stop("the first attempt did not end with the simulated crash",
                    "Keep the script's crash simulation (--fail-at-epoch) as given.")
    report.ok(f"the first attempt crashed at epoch {fail_at_epoch} as planned")
    print("Second attempt, the same job started again:")
    resumed = _launch("04.2", script, nproc=nproc, script_args=args)
    starts = [int(e) for e in re.findall(r"attempt \d+: starting at epoch (\d+)", rank_outputs(resumed).get(0, ""))]
    start = starts[-1] if starts else None
    if start == fail_at_epoch:
        report.ok(f"the second attempt resumed at epoch {start}: epoch {fail_at_epoch - 1} was not trained again")
    elif start == 0:
        report.fail("the second attempt started at epoch 0: the work before the crash was redone",
                    "At start, load the newest checkpoint if there is one and continue from the epoch after it.")
    else:
        report.fail(f"the second attempt started at epoch {start}, expected {fail_at_epoch}",
                    "The checkpoint of the last finished epoch E says to continue at E + 1.")
    logged = [m.get("epoch") for m in resumed.events("epoch")]
    report.expect(logged == list(range(fail_at_epoch, epochs)), f"the second attempt trained epochs {logged}",
                  f"the second attempt logged epochs {logged}, expected {list(range(fail_at_epoch, epochs))}")
    last = checkpoints / f"checkpoint-{epochs - 1}.pt"
    try:
        final = torch.load(last, map_location="cpu", weights_only=True)
        report.expect(final.get("epoch") == epochs - 1 and not any(k.startswith("module.") for k in final["model"]),
                      f"the newest checkpoint is of epoch {epochs - 1}, unwrapped weights",
                      f"the newest checkpoint is of epoch {final.get('epoch')} or has `module.` keys",
                      "Keep lesson 02's save_checkpoint call at the end of every epoch.")
    except Exception as exc:
        report.fail(f"no loadable checkpoint at {last} ({type(exc).__name__})",
                    "Keep lesson 02's save_checkpoint call at the end of every epoch.")
    report.done()


# --- lesson 05: Accelerate ----------------------------------------------------------------------------


def check_accelerate_training(script, nproc: int = 2, max_steps: int | None = None) -> None:
    """Task 05.1: lesson 05's train.py with its Accelerate lines runs as one job of ``nproc`` processes, sharded, in sync."""
    from .launch import failure_message

    report = Report("05.1", f"the Accelerate port on {nproc} processes")
    args = ["--epochs", "1"] + (["--max-steps", str(max_steps)] if max_steps else [])
    result = _launch("05.1", script, nproc=nproc, script_args=args, allow_failure=True)
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
    report.done()


def check_gather_for_metrics(script, nproc: int = 3) -> None:
    """Task 05.2: an Accelerate evaluation that counts each validation sample once at 3 processes."""
    report = Report("05.2", f"evaluate() with Accelerate on {nproc} processes")
    want_acc, want_count = _reference_accuracy()
    result = _launch("05.2", script, nproc=nproc)
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


# --- lesson 06: the Trainer ---------------------------------------------------------------------------


def check_compute_loss(trainer_class) -> None:
    """Task 06.1: ``compute_loss`` with cross-entropy, ``num_items_in_batch``, and outputs the Trainer can read."""
    import tempfile
    import warnings

    import torch.nn.functional as F
    from transformers import TrainingArguments

    from .model import MyModel

    report = Report("06.1", "compute_loss(model, inputs, return_outputs, num_items_in_batch)")
    torch.manual_seed(0)
    model = MyModel().eval()
    X, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = TrainingArguments(output_dir=tmp, report_to="none", use_cpu=True, label_names=["labels"],
                                 remove_unused_columns=False)
        trainer = _call("06.1", trainer_class, model=model, args=args)
        with torch.no_grad():
            logits = model(X)
            mean = F.cross_entropy(logits, y).item()
            total = F.cross_entropy(logits, y, reduction="sum").item()
            raw_nll = F.nll_loss(logits, y).item()
            loss = _call("06.1", trainer.compute_loss, model, {"x": X, "labels": y})
            value = float(loss)
            if math.isclose(value, mean, rel_tol=1e-4):
                report.ok(f"without num_items_in_batch: the mean cross-entropy ({value:.4f})")
            elif math.isclose(value, raw_nll, rel_tol=1e-4):
                report.fail(f"the loss {value:.4f} is nll_loss of the raw outputs (the seed's bug), not cross-entropy {mean:.4f}",
                            "nll_loss expects log-probabilities; the model returns raw scores (logits).")
            else:
                report.fail(f"without num_items_in_batch the loss is {value:.4f}, expected the mean cross-entropy {mean:.4f}")
            loss = _call("06.1", trainer.compute_loss, model, {"x": X, "labels": y}, num_items_in_batch=torch.tensor(32))
            report.expect(math.isclose(float(loss), total / 32, rel_tol=1e-4),
                          f"with num_items_in_batch=32: the summed loss / 32 ({float(loss):.4f})",
                          f"with num_items_in_batch=32 the loss is {float(loss):.4f}, expected sum / 32 = {total / 32:.4f}",
                          "With gradient accumulation the Trainer passes the number of labels in the whole "
                          "accumulated batch: sum the per-sample losses and divide by it.")
            out = _call("06.1", trainer.compute_loss, model, {"x": X, "labels": y}, return_outputs=True)
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

    ``max_steps``: optimizer steps per epoch (the script's ``--max-steps``); None trains the whole epoch.
    """
    report = Report("06.2", f"Trainer on {nproc} processes")
    script_args = ["--epochs", "1"] + (["--max-steps", str(max_steps)] if max_steps else [])
    try:
        result = _launch("06.2", script, nproc=nproc, script_args=script_args)
    except CheckFailed as failed:
        if isinstance(failed, NotAttempted) or "the Trainer sees" not in str(failed):
            raise
        result = None  # the script's own check of the world size stopped the run
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
    report.done()
