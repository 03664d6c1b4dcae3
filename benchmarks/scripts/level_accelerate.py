"""Accelerate level: the raw DDP loop with Accelerator.prepare and accelerator.backward, timed the same way.

    ACCELERATE_USE_CPU=1 torchrun --standalone --nproc-per-node 2 benchmarks/scripts/level_accelerate.py --steps 60
(on a machine with GPUs, without ACCELERATE_USE_CPU=1)
"""
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from common import build_model, parse_args, time_steps, write_result
from course_lib import mnist_tensors


def main():
    args = parse_args(__doc__.splitlines()[0])
    accelerator = Accelerator()
    torch.manual_seed(0)
    X, y = mnist_tensors(train=True, root=args.data_dir)
    # One global loader of per-rank batches; prepare() shards it so each rank gets its own batches.
    loader = DataLoader(TensorDataset(X, y), batch_size=args.batch, shuffle=True)
    model = build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()

    world = accelerator.num_processes
    result = {"level": "accelerate", "model": args.model, "world_size": world,
              "distributed_type": str(accelerator.distributed_type), "device": str(accelerator.device),
              "batch_per_rank": args.batch}
    result["loader"] = time_steps(lambda: loader, step, args, len(loader), world * args.batch, accelerator.device,
                                  on_epoch=loader.set_epoch)
    if accelerator.is_main_process:
        write_result(args.out, result)
        print(f"accelerate x{world} ({result['distributed_type']}): {result['loader']['samples_per_s']:.0f} samples/s")
    accelerator.end_training()


if __name__ == "__main__":
    main()
