"""Checks of lesson 09 (sharding): bytes per rank against a measurement, a sharded checkpoint across world sizes."""
from __future__ import annotations

from .harness import Report, run_harness

STRATEGIES = ("ddp", "zero1", "fsdp")
OPTIMIZERS = ("sgd", "adam")


def check_bytes_per_rank(script, nproc: int = 2) -> None:
    """Task 09.1: ``bytes_per_rank`` gives what DDP, ZeroRedundancyOptimizer and fully_shard really hold per rank."""
    report = Report("09.1", f"bytes_per_rank against tensors measured on each of {nproc} processes")
    found = run_harness("09.1", script, """
    import warnings
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    warnings.filterwarnings("ignore")

    def model():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(240, 240) for _ in range(6)])  # splits evenly over 1, 2 or 3 ranks

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    def nbytes(tensors):
        return sum(local(t).numel() * local(t).element_size() for t in tensors if t is not None)

    def make(kind, params):
        if kind == "sgd":
            return torch.optim.SGD(params, lr=0.01, momentum=0.9)
        return torch.optim.Adam(params, lr=1e-3)

    def measured(strategy, kind, sharded):
        net = model()
        if not sharded:  # a world of one: what every strategy holds on a single process
            optimizer, wrapped = make(kind, net.parameters()), net
        elif strategy == "fsdp":
            mesh = init_device_mesh("cpu", (world_size,))
            for layer in net:
                fully_shard(layer, mesh=mesh)
            wrapped = fully_shard(net, mesh=mesh)
            optimizer = make(kind, wrapped.parameters())
        else:
            wrapped = DDP(net)
            if strategy == "zero1":
                optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=
                                                    torch.optim.SGD if kind == "sgd" else torch.optim.Adam,
                                                    **({"lr": 0.01, "momentum": 0.9} if kind == "sgd" else {"lr": 1e-3}))
            else:
                optimizer = make(kind, wrapped.parameters())
        wrapped(torch.randn(4, 240)).sum().backward()
        optimizer.step()
        state = optimizer.optim.state if strategy == "zero1" and sharded else optimizer.state
        return {"parameters": nbytes(wrapped.parameters()), "gradients": nbytes(p.grad for p in wrapped.parameters()),
                "optimizer": nbytes(t for s in state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)}

    num_params = sum(p.numel() for p in model().parameters())
    cases = {}
    for strategy in ("ddp", "zero1", "fsdp"):
        for kind in ("sgd", "adam"):
            for size, sharded in ((1, False), (world_size, True)):
                try:
                    answer = learner.bytes_per_rank(num_params, kind, size, strategy)
                except NotImplementedError:
                    raise
                except Exception as error:
                    answer = {"error": f"{type(error).__name__}: {error}"}
                answer = {k: float(v) for k, v in answer.items()} if "error" not in answer else answer
                cases[f"{strategy}/{kind}/{size}"] = {"answer": answer, "measured": measured(strategy, kind, sharded)}
    report(num_params=num_params, cases=cases)
    """, nproc=nproc)
    hints = {"parameters": "Parameters are fp32 (4 bytes each); only FSDP shards them.",
             "gradients": "Gradients take as many bytes as the parameters; ZeRO-1 keeps them whole, FSDP shards them.",
             "optimizer": "SGD with momentum keeps one fp32 buffer per parameter, Adam two; ZeRO-1 and FSDP divide "
                          "them by the world size, DDP does not."}
    for rank, r in sorted(found.items()):
        wrong = 0
        for case, values in r["cases"].items():
            answer, measured = values["answer"], values["measured"]
            if "error" in answer or set(answer) != set(measured):
                report.fail(f"rank {rank}, {case}: bytes_per_rank returned {answer}",
                            "Return a dict with the keys 'parameters', 'gradients' and 'optimizer' (bytes on one rank).")
                wrong += 1
                continue
            for key in measured:
                if abs(answer[key] - measured[key]) > 0.01 * max(measured[key], 1):
                    strategy, kind, size = case.split("/")
                    report.fail(f"rank {rank}, {strategy} with {kind} at world size {size}: {key} "
                                f"{answer[key]:,.0f} bytes, measured {measured[key]:,} bytes", hints[key])
                    wrong += 1
        if not wrong:
            report.ok(f"rank {rank}: all {len(r['cases'])} cases ({', '.join(STRATEGIES)} x {', '.join(OPTIMIZERS)} "
                      f"at world sizes 1 and {nproc}, {r['num_params']:,} parameters) equal the measured bytes")
    report.done()


# The model, the batches and one reference run that both launches of task 09.2's check share.
_SHARDED = """
    import json
    import warnings
    from pathlib import Path
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    warnings.filterwarnings("ignore")

    class Net(nn.Module):  # children with parameters of their own, and one without
        def __init__(self):
            super().__init__()
            self.inp, self.act, self.mid, self.out = nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 30), nn.Linear(30, 10)

        def forward(self, x):
            return self.out(self.act(self.mid(self.act(self.inp(x)))))

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(12, 20, generator=g), torch.randint(0, 10, (12,), generator=g)

    def train_steps(model, optimizer, steps):
        for step in steps:
            x, y = batch(step)
            rows = slice(rank * 12 // world_size, (rank + 1) * 12 // world_size)
            optimizer.zero_grad()
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            optimizer.step()

    torch.manual_seed(0)
    model = Net()
    mesh = init_device_mesh("cpu", (world_size,))
    returned = learner.shard(model, mesh)
    units = sorted(name or "(root)" for name, m in model.named_modules() if isinstance(m, FSDPModule))
    all_dtensors = all(isinstance(p, DTensor) for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    folder = Path(FOLDER)
"""


def check_sharded_resume(script, nproc: int = 2) -> None:
    """Task 09.2: ``shard`` makes one unit per child with parameters; ``load_checkpoint`` resumes at another size."""
    import tempfile

    larger = nproc + 1
    report = Report("09.2", f"shard() and load_checkpoint(): saved on {nproc} processes, resumed on {larger}")
    folder = tempfile.mkdtemp(prefix="check-09-2-")
    saved = run_harness("09.2", script, f"    FOLDER = {folder!r}\n" + _SHARDED + """
    train_steps(model, optimizer, range(2))
    learner.save_checkpoint(folder / "checkpoints" / "checkpoint-1.pt", model, optimizer, 1, rank)
    params = {n: p.full_tensor().tolist() for n, p in model.named_parameters()}
    if rank == 0:
        (folder / "saved.json").write_text(json.dumps(params))
    report(units=units, all_dtensors=all_dtensors, returned_model=returned is model)
    """, nproc=nproc)
    first = saved[0]
    report.expect(first["units"] == ["(root)", "inp", "mid", "out"] and first["all_dtensors"],
                  "shard(): one FSDP unit for each child with parameters (inp, mid, out) and the root; every "
                  "parameter a DTensor",
                  f"shard(): the FSDP units are {first['units']}, every parameter a DTensor: {first['all_dtensors']}",
                  "Call fully_shard(child, mesh=mesh) on each child that has parameters (ReLU has none), then "
                  "fully_shard(model, mesh=mesh) on the root.")
    report.expect(first["returned_model"], "shard() returns the model", "shard() does not return the model it sharded",
                  "fully_shard changes the module in place and returns it: return the root's result.")
    if report.failures:
        report.done()
    resumed = run_harness("09.2", script, f"    FOLDER = {folder!r}\n" + _SHARDED + """
    epoch = learner.load_checkpoint(folder / "checkpoints" / "dcp-1", model, optimizer)
    saved = json.loads((folder / "saved.json").read_text())
    loaded_diff = max((p.full_tensor() - torch.tensor(saved[n])).abs().max().item() for n, p in model.named_parameters())
    train_steps(model, optimizer, range(2, 3))
    torch.manual_seed(0)
    reference = Net()  # one process, the whole batches, all 3 steps
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, y = batch(step)
        opt_ref.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        opt_ref.step()
    worst = max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    report(epoch=epoch, loaded_diff=loaded_diff, worst=worst)
    """, nproc=larger)[0]
    report.expect(resumed["epoch"] == 1, "load_checkpoint returned the saved epoch (1)",
                  f"load_checkpoint returned {resumed['epoch']!r}, the checkpoint holds epoch 1",
                  "Put a placeholder 'epoch' in the state dict you load into and return what DCP filled in.")
    same = resumed["loaded_diff"] == 0.0
    report.expect(same, f"the parameters loaded on {larger} processes equal those saved on {nproc}, exactly",
                  f"the parameters loaded on {larger} processes differ from those saved on {nproc} by up to "
                  f"{resumed['loaded_diff']:.2e}",
                  "Build the state dict to load into from get_state_dict(model, optimizer) (this rank's shards), "
                  "dcp.load it, then set_state_dict(...) so that the model and the optimizer take it.")
    if same:
        worst = resumed["worst"]
        report.expect(worst < 1e-5, f"one more step on {larger} processes equals one process's third step "
                      f"(max difference {worst:.1e}): the momentum came back too",
                      f"after one more step the parameters differ from one process's by {worst:.2e}",
                      "The optimizer's state must be loaded as well: pass the optimizer to get_state_dict and "
                      "set_state_dict and load both parts.")
    report.done()
