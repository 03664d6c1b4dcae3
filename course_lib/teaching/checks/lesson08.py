"""Checks of lesson 08 (inside DDP): a DDP that overlaps and accumulates, a communication hook that counts.

Each rank gets only its own rows of batches the check draws at random (``harness.run_harness``), and the check
compares the parameters the ranks end with against one process trained, here, on the whole batches.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .harness import Report, reported, run_harness, secret_generator, secret_seed

STEPS, ROWS = 3, 4  # optimizer steps per case; rows of each micro-batch on each rank (task 08.1)


def mlp():
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def frozen():
    model = mlp()
    model[0].bias.requires_grad_(False)
    return model


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.a, self.b, self.out = nn.Linear(20, 64), nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 10)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.out(torch.relu(self.b(torch.relu(self.a(torch.relu(self.inp(x)))))))


MODELS = {"mlp": mlp, "frozen bias": frozen, "tied weights": Tied}


def _batches(g, size):
    return [(torch.randn(size, 20, generator=g), torch.randint(0, 10, (size,), generator=g)) for _ in range(STEPS)]


def _one_process(make, seed, batches, momentum=0.9):
    """``make()`` seeded with ``seed``, trained with SGD on each whole batch in turn: what DDP must equal."""
    torch.manual_seed(seed)
    model = make()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=momentum)
    for images, labels in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    return model


# The spy on dist.all_reduce that task 08.1's harness installs (it runs inside the launch).
_SPY = """
    import contextlib
    import torch.nn.functional as F
    from course_lib.teaching.checks.lesson08 import MODELS, mlp

    calls, in_backward = [], [False]
    real_all_reduce = dist.all_reduce

    def spy(tensor, *args, **kwargs):
        calls.append({"async": bool(kwargs.get("async_op", False)), "in_backward": in_backward[0]})
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = spy
"""


def check_overlapped_ddp(script, nproc: int = 2) -> None:
    """Task 08.1: ``OverlappedDDP`` equals one process on the whole batch, sends during backward, honours no_sync."""
    report = Report("08.1", f"OverlappedDDP on {nproc} processes against one process on the whole batch")
    g = secret_generator()
    seeds = [secret_seed() for _ in range(nproc)]  # other ranks start elsewhere: only a broadcast helps
    whole = {k: _batches(g, k * nproc * ROWS) for k in (1, 4)}  # step by step, micro-batch by micro-batch

    def rows(k, rank):  # rank's rows of each micro-batch: (micro * world_size + rank) * ROWS onwards
        return [[(x[(m * nproc + rank) * ROWS:(m * nproc + rank + 1) * ROWS], y[(m * nproc + rank) * ROWS:
                 (m * nproc + rank + 1) * ROWS]) for m in range(k)] for x, y in whole[k]]

    inputs = [{"seed": seeds[r], "micro": {str(k): rows(k, r) for k in whole}} for r in range(nproc)]
    found = run_harness("08.1", script, _SPY + """
    def train(make, k):
        torch.manual_seed(inputs["seed"])
        model = make()
        ours = learner.OverlappedDDP(model)
        opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
        calls.clear()
        steps = inputs["micro"][str(k)]
        for micro_batches in steps:
            opt.zero_grad()
            for micro, (images, labels) in enumerate(micro_batches):
                with ours.no_sync() if micro < k - 1 else contextlib.nullcontext():
                    loss = F.cross_entropy(ours(images), labels) / k
                    in_backward[0] = True
                    loss.backward()
                    in_backward[0] = False
            ours.sync_gradients()
            opt.step()
        return {"parameters": [p.detach().clone() for p in model.parameters()],
                "calls_per_step": len(calls) / len(steps), "async": all(c["async"] for c in calls),
                "in_backward": all(c["in_backward"] for c in calls),
                "params": sum(1 for p in model.parameters() if p.requires_grad)}

    report(**{f"{name} k={k}": train(make, k) for name, make in MODELS.items() for k in (1, 4)})
    """, nproc=nproc, inputs=inputs)
    references = {f"{name} k={k}": list(_one_process(make, seeds[0], whole[k]).parameters())
                  for name, make in MODELS.items() for k in (1, 4)}
    for rank, values in sorted(found.items()):
        cases = {}
        for case, want in references.items():
            r = reported("08.1", rank, values, case)
            got = r.get("parameters") if isinstance(r, dict) else None
            if not isinstance(got, list) or [t.shape for t in got if torch.is_tensor(t)] != [w.shape for w in want]:
                report.stop(f"rank {rank}, {case}: the harness reported no parameters of the right shapes",
                            "Keep the model's parameters as they are: OverlappedDDP wraps the model it is given.")
            cases[case] = dict(r, worst=max((p.float() - q).abs().max().item() for p, q in zip(got, want)))
        failures = len(report.failures)
        for case, r in cases.items():
            where = f"rank {rank}, {case}"
            if r["worst"] >= 1e-5:
                single = cases.get(case.replace("k=4", "k=1"), r)
                report.fail(f"{where}: parameters differ from the reference's by up to {r['worst']:.2e}",
                            "With one micro-batch the parameters are right, with 4 they are not: inside no_sync() "
                            "nothing may be sent, the gradients add up locally and travel once, after the last "
                            "micro-batch." if case.endswith("k=4") and single["worst"] < 1e-5 else
                            "Average each gradient once per step: the sum of the ranks' gradients divided by the "
                            "world size, every rank starting from rank 0's weights.")
            elif r["calls_per_step"] != r["params"]:
                many = r["calls_per_step"] > r["params"] and case.endswith("k=4")
                report.fail(f"{where}: {r['calls_per_step']:g} all_reduce calls per step for {r['params']} parameters "
                            "that need a gradient",
                            "Inside no_sync() nothing may be sent: only the last micro-batch's backward() sends."
                            if many else "One all_reduce per parameter per step, started from its hook.")
            elif not (r["async"] and r["in_backward"]):
                report.fail(f"{where}: the all_reduces were not all started asynchronously during backward()",
                            "Start each one in the gradient hook with async_op=True and wait for them in "
                            "sync_gradients(): that is the overlap.")
        if len(report.failures) == failures:
            worst = max(r["worst"] for r in cases.values())
            report.ok(f"rank {rank}: all {len(cases)} cases (3 models, 1 and 4 micro-batches) equal the reference "
                      f"(max difference {worst:.1e}), one asynchronous all_reduce per parameter per step, each "
                      "started during backward()")
    report.done()


def check_counting_hook(script, nproc: int = 2) -> None:
    """Task 08.2: DDP with ``counting_allreduce_hook`` trains as plain DDP does and counts its buckets and bytes."""
    report = Report("08.2", f"counting_allreduce_hook registered on DDP, {nproc} processes")
    g = secret_generator()
    whole = _batches(g, nproc * 8)
    inputs = [[(x[r::nproc], y[r::nproc]) for x, y in whole] for r in range(nproc)]  # each rank's rows only
    train = """
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from course_lib.teaching.checks.lesson08 import mlp

    torch.manual_seed(0)
    ddp = DDP(mlp(), bucket_cap_mb=0.01)  # 2 buckets once DDP has rebuilt them after the first step
    state = {"buckets": 0, "bytes": 0}
    ddp.register_comm_hook(state, HOOK)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for images, labels in inputs:
        optimizer.zero_grad()
        F.cross_entropy(ddp(images), labels).backward()
        optimizer.step()
    report(parameters=[p.detach().clone() for p in ddp.module.parameters()],
           state={k: state.get(k) for k in ("buckets", "bytes")})
    """
    # What was really sent: the same DDP with the check's own counting hook, in a launch without your file.
    sent = run_harness("08.2", script, """
    def counted(state, bucket):
        state["buckets"] += 1
        state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0] / world_size)
    """ + train.replace("HOOK", "counted"), nproc=nproc, inputs=inputs, load_learner=False)[0]["state"]
    found = run_harness("08.2", script, train.replace("HOOK", "learner.counting_allreduce_hook"), nproc=nproc,
                        inputs=inputs)
    want = list(_one_process(mlp, 0, whole).parameters())
    for rank, r in sorted(found.items()):
        where = f"rank {rank}"
        got = reported("08.2", rank, r, "parameters")
        if not isinstance(got, list) or [t.shape for t in got if torch.is_tensor(t)] != [w.shape for w in want]:
            report.stop(f"{where}: the harness reported no parameters of the right shapes")
        worst = max((p.float() - q).abs().max().item() for p, q in zip(got, want))
        report.expect(worst < 1e-5, f"{where}: the parameters equal one process's on the whole batches after "
                      f"{STEPS} steps (max difference {worst:.1e}), as plain DDP's do",
                      f"{where}: the parameters differ from one process's on the whole batches by up to {worst:.2e}",
                      "Each rank trains on its own rows: the hook must all_reduce the bucket's buffer and hand back "
                      "the average, the sum divided by the world size.")
        state = reported("08.2", rank, r, "state")
        buckets, nbytes = state.get("buckets"), state.get("bytes")
        report.expect(buckets == sent["buckets"], f"{where}: state['buckets'] = {buckets}, one per bucket sent in "
                      f"{STEPS} steps", f"{where}: state['buckets'] = {buckets}, but DDP sent {sent['buckets']} "
                      f"buckets in {STEPS} steps (counted by the check's own hook)",
                      "Add 1 to state['buckets'] each time the hook is called.")
        report.expect(nbytes == sent["bytes"], f"{where}: state['bytes'] = {nbytes:,} ({STEPS} steps of "
                      f"{sent['bytes'] // STEPS:,} bytes of gradients)", f"{where}: state['bytes'] = {nbytes}, "
                      f"expected {sent['bytes']:,} ({STEPS} steps of {sent['bytes'] // STEPS:,} bytes)",
                      "Count the bucket buffer's bytes: numel() * element_size().")
    report.done()
