"""Checks of lesson 03 (pitfalls): a batch of one, a safe checkpoint load, rank-0 evaluation."""
from __future__ import annotations

import re
from pathlib import Path
import torch

from ..sandbox import is_module
from .harness import (CheckFailed, NotAttempted, Report, call, launch_script, rank_outputs, secret_correct, secret_mnist,
                      shared_folder)


def check_batch_of_one(model_class) -> None:
    """Task 03.1: the model's output is (N, 10) for every N, one sample included."""
    import torch.nn.functional as F

    from course_lib.model import MyModel

    report = Report("03.1", "the seed's model on a batch of one sample")
    torch.manual_seed(0)
    reference = MyModel().eval()
    model = call("03.1", model_class)
    try:
        model.load_state_dict(reference.state_dict())
    except (RuntimeError, AttributeError) as exc:
        report.stop(f"the model's layers changed, so the seed's weights no longer load: {str(exc)[:200]}",
                    "Keep conv, norm and head as they are; only the end of forward() needs the fix.")
    model.eval()
    X = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        for n in (5, 1):
            out = call("03.1", model, X[:n])
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
    from course_lib.model import MyModel

    report = Report("03.2", "load_model(path) for the seed's and the course's checkpoints")
    torch.manual_seed(7)
    trained = MyModel()
    with shared_folder() as tmp:
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
                model = call("03.2", load_model, path)
            except NotAttempted:
                raise
            except Exception as exc:
                report.fail(f"{story}: load_model raised {type(exc).__name__}: {str(exc)[:300]}",
                            "DDP's state_dict names every tensor `module.<name>`; MyModel expects `<name>`.")
                continue
            if not is_module(model):  # a module here, or one in the grader's sandbox of the submission
                report.fail(f"{story}: load_model returned {getattr(model, 'type_name', type(model).__name__)}, "
                            "expected a MyModel")
                continue
            same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
            report.expect(same and set(model.state_dict()) == set(trained.state_dict()),
                          f"{story}: loaded, weights identical", f"{story}: loaded, but the weights differ",
                          "Load every tensor of the file into a fresh MyModel.")
        evil, marker = tmp / "evil.pt", tmp / "code-ran-here"
        torch.save({"model": _RunsCodeWhenLoaded(marker)}, evil)
        try:
            call("03.2", load_model, evil)
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
    """Task 03.3: rank 0 evaluates every epoch without calling DDP's forward alone; nothing hangs. The script trains on
    MNIST with its classes renamed by a secret permutation (harness.secret_mnist): its last checkpoint is evaluated
    here and must agree with what rank 0 logged."""
    report = Report("03.3", f"{epochs} epochs of {max_steps} steps on {nproc} processes with rank-0 evaluation")
    with secret_mnist() as (data, _):
        try:
            result = launch_script("03.3", script, nproc=nproc, timeout=150,
                                   script_args=["--epochs", str(epochs), "--max-steps", str(max_steps),
                                                "--data-dir", str(data)])
        except NotAttempted:
            raise
        except CheckFailed as exc:  # the seed's bug ends in a crash or a hang; say why
            raise CheckFailed(f"{exc}\nHint: DDP's forward is itself a collective (it broadcasts BatchNorm buffers "
                              "from rank 0); rank 0 alone must not call it.") from None
        judged = secret_correct(Path(result.run_dir) / "checkpoints" / f"checkpoint-{epochs - 1}.pt", data)
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
    report.expect(judged is not None and bool(accs) and abs(judged / 10000 - accs[-1]) <= 0.001,
                  f"the last checkpoint, evaluated by the check on this run's labels, scores {(judged or 0) / 10000:.4f}, "
                  "what rank 0 logged",
                  f"the last checkpoint scores {'nothing' if judged is None else f'{judged / 10000:.4f}'} on this "
                  f"run's labels, rank 0 logged {accs[-1] if accs else None}",
                  "Keep the script's save_checkpoint at the end of every epoch, and evaluate the weights it saves.")
    outputs = rank_outputs(result)
    sums = {r: re.findall(r"parameter checksum ([-\d.e+]+)", outputs.get(r, "")) for r in range(nproc)}
    same = all(sums.values()) and len({s[-1] for s in sums.values()}) == 1
    report.expect(same, "every rank ends with the same weights",
                  "the ranks end with different weights: a collective was paired with the wrong one",
                  "DDP's forward is itself a collective (it broadcasts BatchNorm buffers): "
                  "a forward that only rank 0 runs must not go through the wrapper.")
    report.done()
