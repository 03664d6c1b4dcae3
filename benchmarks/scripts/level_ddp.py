"""Raw DDP level: the lesson-02 loop (TensorDataset, DistributedSampler, DDP), timed, plus where a step's time goes.

    torchrun --standalone --nproc-per-node 2 benchmarks/scripts/level_ddp.py --steps 60 --out /tmp/ddp.json
    torchrun --standalone --nproc-per-node 2 benchmarks/scripts/level_ddp.py --model mymodel,resnet18 \\
        --batch 128,32 --steps 30,2 --warmup 5,1

Measures, in this order, for each model (rank 0 writes them):
  loader        steps fed by the DataLoader, as in lesson 02 (the baseline of the abstraction levels);
  compute_only  the same steps on this rank's batches sliced ahead, already on the device (no data loading);
  no_sync       compute_only without the gradient all-reduce (``model.no_sync()``);
  comm          compute_only again through a DDP communication hook that times each all-reduce.
"""
import gc
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from common import build_model, grad_bytes, local_world_size, parse_args, steps_per_epoch, time_steps, write_result
from course_lib import mnist_tensors


class CommTimer:
    """State of the timing hook: seconds from a bucket being handed to all-reduce until it is reduced."""

    def __init__(self, world: int):
        self.world = world
        self.seconds = 0.0
        self.buckets = 0


def timed_allreduce(state: CommTimer, bucket):
    start = time.perf_counter()
    future = dist.all_reduce(bucket.buffer().div_(state.world), async_op=True).get_future()

    def done(fut):
        state.seconds += time.perf_counter() - start
        state.buckets += 1
        return fut.value()[0]

    return future.then(done)


def measure(name: str, batch: int, knobs, X, y, device, use_cuda: bool, local_rank: int) -> dict:
    """The four measurements for one model (see the module docstring)."""
    world = dist.get_world_size()
    torch.manual_seed(0)
    dataset = TensorDataset(X, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
    module = build_model(name).to(device)
    model = DDP(module, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(module.parameters(), lr=knobs.lr, momentum=0.9)
    per_epoch = steps_per_epoch(len(dataset), world, batch)
    global_batch = world * batch

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(wrapped(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))
        loss.backward()
        optimizer.step()

    wrapped = model
    result = {"level": "ddp", "model": name, "world_size": world, "backend": dist.get_backend(),
              "device": str(device), "batch_per_rank": batch, "grad_bytes": grad_bytes(module)}
    result["loader"] = time_steps(lambda: loader, step, knobs, per_epoch, global_batch, device,
                                  on_epoch=sampler.set_epoch)

    # This rank's batches sliced ahead, already on the device: the same steps with no data work left.
    # (Repeating one batch is no ceiling: the model fits it and its gradients become slow denormals.)
    fixed = [(X[index].to(device), y[index].to(device)) for index in torch.tensor(list(sampler)).split(batch)]
    result["compute_only"] = time_steps(lambda: fixed, step, knobs, per_epoch, global_batch, device)
    with model.no_sync():  # the same steps without any gradient all-reduce
        result["no_sync"] = time_steps(lambda: fixed, step, knobs, per_epoch, global_batch, device)

    # A fresh wrapper with the timing hook; the old one goes first so its gradient hooks are removed.
    del model, wrapped
    gc.collect()
    timer = CommTimer(world)
    wrapped = DDP(module, device_ids=[local_rank] if use_cuda else None)
    wrapped.register_comm_hook(timer, timed_allreduce)
    hooked = time_steps(lambda: fixed, step, knobs, per_epoch, global_batch, device)
    timed_steps = hooked["steps_timed"] + (knobs.warmup if knobs.steps else 0)
    comm_step_s = timer.seconds / timed_steps
    result["comm"] = {
        "step_s": hooked["step_s"], "allreduce_s_per_step": comm_step_s, "buckets_per_step": timer.buckets / timed_steps,
        "share_hook": comm_step_s / hooked["step_s_median"],
        "share_no_sync": max(0.0, 1 - result["no_sync"]["step_s"] / result["compute_only"]["step_s"]),
        "allreduce_GB_per_s": result["grad_bytes"] / comm_step_s / 1e9 if comm_step_s > 0 else None,
    }
    del wrapped
    gc.collect()
    return result


@record
def main():
    args = parse_args(__doc__.splitlines()[0], several=True)
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    local_rank = rank % local_world_size()
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    X, y = mnist_tensors(train=True, root=args.data_dir)
    results = {}
    for name, batch, steps, warmup in zip(args.model, args.batch, args.steps, args.warmup):
        knobs = SimpleNamespace(steps=steps, warmup=warmup, epochs=args.epochs, lr=args.lr)
        results[name] = r = measure(name, batch, knobs, X, y, device, use_cuda, local_rank)
        if rank == 0:
            print(f"{name} x{r['world_size']}: {r['loader']['samples_per_s']:.0f} samples/s, all-reduce share "
                  f"{r['comm']['share_hook']:.0%} (hook) / {r['comm']['share_no_sync']:.0%} (no_sync)")
    if rank == 0:
        write_result(args.out, {"level": "ddp", "models": results})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
