"""Checks of lesson 01 (collectives): gradients averaged by hand, a global mean, a broadcast model.

Each rank gets inputs only the check knows (a batch, some values, a seed: ``harness.run_harness``), and the check
compares what the ranks send back with references it computes itself from every rank's inputs.
"""
from __future__ import annotations

import math
import torch

from .harness import Report, reported, run_harness, secret_generator, secret_seed

SHARD = 6  # samples of the batch on each rank (task 01.1)


def check_average_gradients(script, nproc: int = 2) -> None:
    """Task 01.1: after ``average_gradients(model)`` every rank holds the gradient of the whole batch."""
    import torch.nn.functional as F
    from course_lib.model import MyModel

    report = Report("01.1", f"average_gradients on {nproc} processes equals the whole batch's gradient")
    g = secret_generator()
    shards = [{"images": torch.randn(SHARD, 1, 28, 28, generator=g), "labels": torch.randint(0, 10, (SHARD,), generator=g)}
              for _ in range(nproc)]
    found = run_harness("01.1", script, """
        import torch.nn.functional as F
        from course_lib import MyModel

        torch.manual_seed(1)
        model = MyModel().eval()  # eval: BatchNorm's running statistics, so shard losses add up exactly
        F.cross_entropy(model(inputs["images"]), inputs["labels"]).backward()  # this rank's shard only
        learner.average_gradients(model)
        report(gradient=torch.cat([p.grad.flatten() for p in model.parameters()]))
    """, nproc=nproc, inputs=shards)
    torch.manual_seed(1)
    reference = MyModel().eval()
    F.cross_entropy(reference(torch.cat([s["images"] for s in shards])), torch.cat([s["labels"] for s in shards])).backward()
    want = torch.cat([p.grad.flatten() for p in reference.parameters()])
    for rank, values in sorted(found.items()):
        got = reported("01.1", rank, values, "gradient", like=want).float()
        diff, ratio = (got - want).abs().max().item(), (got @ want / (want @ want)).item()
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
    g = secret_generator()
    shards = [torch.rand(rank + 1, generator=g) * 100 for rank in range(nproc)]
    found = run_harness("01.2", script, """
        report(mean=float(learner.global_mean(inputs)))
    """, nproc=nproc, inputs=shards)
    everything = torch.cat(shards).double()
    expected = everything.mean().item()
    mean_of_means = sum(s.double().mean().item() for s in shards) / nproc
    for rank, values in sorted(found.items()):
        got = float(reported("01.2", rank, values, "mean"))
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
    from course_lib.model import MyModel

    report = Report("01.3", f"broadcast_model on {nproc} processes gives every rank rank 0's weights")
    starts = [{"seed": secret_seed(), "running_mean": float(torch.rand(1, generator=secret_generator()))}
              for _ in range(nproc)]
    found = run_harness("01.3", script, """
        from course_lib import MyModel

        torch.manual_seed(inputs["seed"])  # every rank starts from different weights...
        model = MyModel()
        model.norm.running_mean.fill_(inputs["running_mean"])  # ...and different buffers
        learner.broadcast_model(model)
        report(state=model.state_dict())
    """, nproc=nproc, inputs=starts)
    torch.manual_seed(starts[0]["seed"])
    expected = MyModel()
    expected.norm.running_mean.fill_(starts[0]["running_mean"])
    want = expected.state_dict()
    parameters = {name for name, _ in expected.named_parameters()}
    for rank, values in sorted(found.items()):
        state = reported("01.3", rank, values, "state")
        if not isinstance(state, dict) or set(state) != set(want):
            report.fail(f"rank {rank}: the model's state_dict keys changed: {sorted(state)[:6]}...",
                        "Change the tensors' values in place; keep the model's structure.")
            continue
        diffs = {k: (v.float() - want[k].float()).abs().max().item() for k, v in state.items()}
        worst_params = max(diffs[k] for k in parameters)
        worst_buffers = max(diffs[k] for k in want if k not in parameters)
        report.expect(worst_params == 0, f"rank {rank}: parameters equal rank 0's",
                      f"rank {rank}: parameters differ from rank 0's by up to {worst_params:.3g}",
                      "Every rank must call the collective for every tensor, with rank 0 as the source.")
        report.expect(worst_buffers == 0, f"rank {rank}: buffers (BatchNorm statistics) equal rank 0's",
                      f"rank {rank}: buffers differ from rank 0's by up to {worst_buffers:.3g}",
                      "Buffers are not parameters: model.state_dict() holds both.")
    report.done()
