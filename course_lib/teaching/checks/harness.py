"""The checks' shared harness: how a check reports, calls the learner's function, launches their script."""
from __future__ import annotations

import json
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


def call(task: str, fn, *args, **kwargs):
    """Call the learner's function; its NotImplementedError means 'not attempted'."""
    if not callable(fn):
        raise CheckFailed(f"Task {task}: expected a function, got {fn!r}. Pass the function itself (no parentheses).")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        name = getattr(fn, "__qualname__", None) or type(fn).__name__  # a function, a method or a model
        raise not_attempted(task, f"`{name}`") from None


def has_placeholder(path: Path) -> bool:
    """Whether the file still holds the exercise's placeholder line (``exercises.CODE_STUB``) as code."""
    from ..exercises import CODE_STUB

    placeholder = CODE_STUB.splitlines()[-1]
    return any(line.strip() == placeholder for line in Path(path).read_text(errors="replace").splitlines())


def launch_script(task: str, script, nproc: int = 2, script_args=(), timeout: float = LAUNCH_TIMEOUT,
            max_restarts: int = 0, env: dict | None = None, allow_failure: bool = False):
    """Run ``script`` with torchrun; a missing script, a hang or a failing rank becomes a clear CheckFailed.

    ``allow_failure``: a failing run is returned (unless it failed on the exercise's NotImplementedError).
    """
    from course_lib.launch import LaunchTimeout, failure_message, torchrun

    script = Path(script)
    if not script.is_file():
        raise CheckFailed(f"Task {task}: there is no script at {script}. Run the cell that writes it "
                          "(the one starting with %%write_script) first, then this check.")
    if has_placeholder(script):
        raise not_attempted(task, f"the script {script}")  # known without launching it
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
    """Each rank's whole output, as the launch read it from torchrun's per-rank log files."""
    return dict(result.outputs)


def rank_results(result) -> dict[int, dict]:
    """The ``CHECK-RESULT {json}`` line each rank printed (the harness's report), by rank."""
    found = {}
    for rank, text in rank_outputs(result).items():
        for line in text.splitlines():
            if line.startswith(RESULT_PREFIX):
                found[rank] = json.loads(line[len(RESULT_PREFIX):])
    return found


HARNESS = '''\
"""Written by course_lib.teaching.checks for task {task}: calls your code in {learner} on every rank.

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
    dist.barrier()  # no rank tears the group down while another still talks to it (gloo can abort then)
finally:
    dist.destroy_process_group()
'''


def run_harness(task: str, learner_script, body: str, nproc: int = 2) -> dict[int, dict]:
    """Launch a small script that imports the learner's file and runs ``body`` on every rank."""
    learner_script = Path(learner_script)
    if not learner_script.is_file():
        raise CheckFailed(f"Task {task}: there is no file {learner_script}. Run the cell that writes it "
                          "(the one starting with %%write_script) first, then this check.")
    if has_placeholder(learner_script):  # each harness task has a file of its own: not attempted yet
        raise not_attempted(task, f"{learner_script}")
    harness = learner_script.with_name(f"_check_{learner_script.stem}.py")
    text = HARNESS.format(task=task, learner=learner_script.name, learner_path=str(learner_script.resolve()),
                           this=harness.as_posix(), prefix=RESULT_PREFIX,
                           body=textwrap.indent(textwrap.dedent(body).strip("\n"), "    "))
    harness.write_text(text)
    result = launch_script(task, harness, nproc=nproc)
    found = rank_results(result)
    missing = sorted(set(range(nproc)) - set(found))
    if missing:
        outputs = rank_outputs(result)
        raise CheckFailed(f"Task {task}: rank(s) {missing} reported no result. Their output:\n"
                          + "\n".join(outputs.get(r, "")[-1000:] for r in missing))
    return found


def reference_accuracy(seed: int = 0) -> tuple[float, int]:
    """Top-1 of an untrained ``MyModel`` (seeded) over the whole validation set, in one process."""
    from course_lib.data import mnist_tensors
    from course_lib.model import MyModel

    X, y = mnist_tensors(train=False)
    torch.manual_seed(seed)
    model = MyModel().eval()
    with torch.no_grad():
        correct = sum((model(X[i:i + 2000]).argmax(1) == y[i:i + 2000]).sum().item() for i in range(0, len(y), 2000))
    return correct / len(y), len(y)


def reference_top3(seed: int = 0) -> float:
    """Top-3 accuracy of the untrained ``MyModel`` of ``reference_accuracy``, in one process."""
    from course_lib.data import mnist_tensors
    from course_lib.model import MyModel

    X, y = mnist_tensors(train=False)
    torch.manual_seed(seed)
    model = MyModel().eval()
    with torch.no_grad():
        hits = sum((model(X[i:i + 2000]).topk(3, dim=1).indices == y[i:i + 2000, None]).any(dim=1).sum().item()
                   for i in range(0, len(y), 2000))
    return hits / len(y)
