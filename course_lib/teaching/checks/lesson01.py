"""Checks of lesson 01 (collectives): gradients averaged by hand, a global mean, a broadcast model."""
from __future__ import annotations

import math
import torch

from .harness import Report, call, run_harness


def check_average_gradients(script, nproc: int = 2) -> None:
    """Task 01.1: after ``average_gradients(model)`` every rank holds the gradient of the whole batch."""
    report = Report("01.1", f"average_gradients on {nproc} processes equals the whole batch's gradient")
    found = run_harness("01.1", script, """
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
    found = run_harness("01.2", script, """
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
    found = run_harness("01.3", script, """
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
