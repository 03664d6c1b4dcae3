"""Checks of lesson 08 (inside DDP): a DDP that overlaps and accumulates, a communication hook that counts."""
from __future__ import annotations

from .harness import Report, run_harness

# The models and the spy on dist.all_reduce that both checks' harnesses share (they run inside the launch).
_MODELS = """
    import contextlib
    import torch.nn.functional as F
    from torch import nn

    def mlp():
        return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def frozen():
        model = mlp()
        model[0].bias.requires_grad_(False)
        return model

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.a, self.b, self.out = (nn.Linear(20, 64), nn.Linear(64, 64), nn.Linear(64, 64),
                                                  nn.Linear(64, 10))
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.out(torch.relu(self.b(torch.relu(self.a(torch.relu(self.inp(x)))))))

    MODELS = {"mlp": mlp, "frozen bias": frozen, "tied weights": Tied}
    calls, in_backward = [], [False]
    real_all_reduce = dist.all_reduce

    def spy(tensor, *args, **kwargs):
        calls.append({"async": bool(kwargs.get("async_op", False)), "in_backward": in_backward[0]})
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = spy

    def batch_of(step, size):
        g = torch.Generator().manual_seed(step)
        return torch.randn(size, 20, generator=g), torch.randint(0, 10, (size,), generator=g)
"""


def check_overlapped_ddp(script, nproc: int = 2) -> None:
    """Task 08.1: ``OverlappedDDP`` equals one process on the whole batch, sends during backward, honours no_sync."""
    report = Report("08.1", f"OverlappedDDP on {nproc} processes against one process on the whole batch")
    found = run_harness("08.1", script, _MODELS + """
    def train(make, k, steps=3, batch=4):
        torch.manual_seed(0)
        reference = make()
        torch.manual_seed(0 if rank == 0 else 100 + rank)  # other ranks start elsewhere: only a broadcast helps
        model = make()
        ours = learner.OverlappedDDP(model)
        opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
        calls.clear()
        worst = 0.0
        for step in range(steps):
            images, labels = batch_of(step, k * world_size * batch)
            opt_ref.zero_grad()
            F.cross_entropy(reference(images), labels).backward()
            opt_ref.step()
            opt.zero_grad()
            for micro in range(k):
                rows = slice((micro * world_size + rank) * batch, (micro * world_size + rank + 1) * batch)
                with ours.no_sync() if micro < k - 1 else contextlib.nullcontext():
                    loss = F.cross_entropy(ours(images[rows]), labels[rows]) / k
                    in_backward[0] = True
                    loss.backward()
                    in_backward[0] = False
            ours.sync_gradients()
            opt.step()
            worst = max(worst, max((p - q).abs().max().item()
                                   for p, q in zip(reference.parameters(), model.parameters())))
        return {"worst": worst, "calls_per_step": len(calls) / steps, "async": all(c["async"] for c in calls),
                "in_backward": all(c["in_backward"] for c in calls),
                "params": sum(1 for p in model.parameters() if p.requires_grad)}

    report(**{f"{name} k={k}": train(make, k) for name, make in MODELS.items() for k in (1, 4)})
    """, nproc=nproc)
    for rank, cases in sorted(found.items()):
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
    found = run_harness("08.2", script, _MODELS + """
    from torch.nn.parallel import DistributedDataParallel as DDP

    def trained(hook, steps=3):
        torch.manual_seed(0)
        ddp = DDP(mlp(), bucket_cap_mb=0.01)  # 2 buckets once DDP has rebuilt them after the first step
        state = {"buckets": 0, "bytes": 0}
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        for step in range(steps):
            images, labels = batch_of(step, world_size * 8)
            optimizer.zero_grad()
            F.cross_entropy(ddp(images[rank::world_size]), labels[rank::world_size]).backward()
            optimizer.step()
        return ddp.module, state

    plain, _ = trained(None)
    calls.clear()
    hooked, state = trained(learner.counting_allreduce_hook)
    report(worst=max((p - q).abs().max().item() for p, q in zip(plain.parameters(), hooked.parameters())),
           state={k: state.get(k) for k in ("buckets", "bytes")}, all_reduces=len(calls),
           grad_bytes=sum(p.numel() * p.element_size() for p in plain.parameters()))
    """, nproc=nproc)
    steps = 3
    for rank, r in sorted(found.items()):
        where = f"rank {rank}"
        report.expect(r["worst"] < 1e-6, f"{where}: the parameters equal plain DDP's after {steps} steps",
                      f"{where}: the parameters differ from plain DDP's by up to {r['worst']:.2e}",
                      "The hook must hand back the average, not the sum: divide the buffer by the world size.")
        report.expect(r["all_reduces"] >= steps, f"{where}: the hook sent with dist.all_reduce ({r['all_reduces']} "
                      "calls)", f"{where}: dist.all_reduce was called {r['all_reduces']} times in {steps} steps",
                      "Send the bucket's buffer with dist.all_reduce(..., async_op=True).")
        buckets, sent = r["state"]["buckets"], r["state"]["bytes"]
        report.expect(buckets == r["all_reduces"], f"{where}: state['buckets'] = {buckets}, one per bucket sent",
                      f"{where}: state['buckets'] = {buckets}, but {r['all_reduces']} buckets were sent",
                      "Add 1 to state['buckets'] each time the hook is called.")
        report.expect(sent == steps * r["grad_bytes"], f"{where}: state['bytes'] = {sent:,} ({steps} steps x "
                      f"{r['grad_bytes']:,} bytes of gradients)", f"{where}: state['bytes'] = {sent}, expected "
                      f"{steps * r['grad_bytes']:,} ({steps} steps of {r['grad_bytes']:,} bytes)",
                      "Count the bucket buffer's bytes: numel() * element_size().")
    report.done()
