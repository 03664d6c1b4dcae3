"""Checks of lesson 04 (torchrun): atomic checkpoints and resume after a crash."""
from __future__ import annotations

import re
from pathlib import Path
import torch

from .harness import (Report, call, launch_script, not_attempted, rank_outputs, secret_correct, secret_mnist,
                      shared_folder)


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
    import torch.nn.functional as F

    from course_lib.model import MyModel

    report = Report("04.1", "save_checkpoint / load_checkpoint")

    def trained_pair(seed):
        torch.manual_seed(seed)
        model = MyModel()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        X, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
        F.cross_entropy(model(X), y).backward()
        optimizer.step()  # now the optimizer has momentum buffers worth saving
        return model, optimizer

    with shared_folder() as tmp:
        folder = Path(tmp) / "checkpoints"
        folder.mkdir(mode=0o777)
        folder.chmod(0o777)  # past the umask: the learner's code may run as another user (the grader's sandbox)
        path = folder / "checkpoint-4.pt"
        model, optimizer = trained_pair(0)
        call("04.1", save_checkpoint, path, _Wrapped(model), optimizer, 4)
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
        start = call("04.1", load_checkpoint, path, _Wrapped(fresh), fresh_optimizer)
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
        start = call("04.1", load_checkpoint, folder / "checkpoint-9.pt", untouched, untouched_optimizer)
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
    """Task 04.2: a job that crashed at ``fail_at_epoch`` resumes from its newest checkpoint when started again. Both
    attempts train on MNIST with its classes renamed by a secret permutation (harness.secret_mnist), and the check
    evaluates the checkpoints of both attempts itself."""
    report = Report("04.2", f"a crash at epoch {fail_at_epoch}, then the job started again")
    with secret_mnist() as (data, _):
        _resume(report, Path(script), nproc, epochs, fail_at_epoch, max_steps, data)
    report.done()


def _resume(report, script, nproc, epochs, fail_at_epoch, max_steps, data) -> None:
    import shutil

    checkpoints = script.parent / "checkpoints"
    shutil.rmtree(checkpoints, ignore_errors=True)  # a fresh job: no checkpoint from an earlier run
    args = ["--epochs", str(epochs), "--max-steps", str(max_steps), "--data-dir", str(data)]
    print("First attempt, with a crash:")
    crashed = launch_script("04.2", script, nproc=nproc, script_args=args + ["--fail-at-epoch", str(fail_at_epoch)],
                      allow_failure=True, agent=True)
    if crashed.ok or "simulated crash" not in "\n".join(rank_outputs(crashed).values()):
        report.stop("the first attempt did not end with the simulated crash",
                    "Keep the script's crash simulation (--fail-at-epoch) as given.")
    report.ok(f"the first attempt crashed at epoch {fail_at_epoch} as planned")
    print("Second attempt, the same job started again:")
    resumed = launch_script("04.2", script, nproc=nproc, script_args=args, agent=True)
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
    before, after = (secret_correct(checkpoints / f"checkpoint-{e}.pt", data) for e in (fail_at_epoch - 1, epochs - 1))
    accs = [m.get("val_acc") for m in resumed.events("epoch")]
    report.expect(before is not None and before > 5000 and after is not None and bool(accs) and accs[-1] is not None
                  and abs(after / 10000 - accs[-1]) <= 0.001,
                  f"evaluated by the check on this run's labels, the first attempt's checkpoint scores "
                  f"{(before or 0) / 10000:.4f} and the last one {(after or 0) / 10000:.4f}, what the job logged",
                  f"evaluated by the check on this run's labels, the checkpoints score {before} and {after} of "
                  f"10,000 (the job logged {accs[-1] if accs else None} last)",
                  "Train on the data the script is given (--data-dir) and save the weights you trained.")
