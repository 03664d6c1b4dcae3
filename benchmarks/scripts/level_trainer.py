"""Trainer level: the same model, data, batch and optimizer handed to the Hugging Face Trainer, timed by a callback.

    ACCELERATE_USE_CPU=1 torchrun --standalone --nproc-per-node 2 benchmarks/scripts/level_trainer.py --steps 60
(on a machine with GPUs, without ACCELERATE_USE_CPU=1)
"""
import math
import time

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from common import build_model, chunk_size, figures, parse_args, sync, write_result
from course_lib import mnist_tensors


def collate(samples):
    """TensorDataset items (x, y) into the dict the Trainer passes to compute_loss."""
    return {"x": torch.stack([x for x, _ in samples]), "labels": torch.stack([y for _, y in samples])}


class ClassifierTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(inputs["x"])
        loss = F.cross_entropy(logits, inputs["labels"])
        return (loss, logits) if return_outputs else loss


class StepClock(TrainerCallback):
    """Times steps warmup+1 .. warmup+steps in chunks (or each whole epoch), as the other levels do."""

    def __init__(self, warmup: int, steps: int, device):
        self.warmup, self.steps, self.device = warmup, steps, device
        self.chunk = chunk_size(steps) if steps else 0
        self.start = None
        self.chunks = []

    def on_train_begin(self, args, state, control, **kwargs):
        if self.steps and self.warmup == 0:
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        timed = state.global_step - self.warmup
        if not self.steps or timed < 0:
            return
        if timed == 0 or timed % self.chunk == 0 or timed == self.steps:
            sync(self.device)
            now = time.perf_counter()
            if timed > 0:
                self.chunks.append((now - self.start) / (timed - (math.ceil(timed / self.chunk) - 1) * self.chunk))
            self.start = now

    def on_epoch_begin(self, args, state, control, **kwargs):
        if not self.steps:
            self.start = time.perf_counter()
            self.first_step = state.global_step

    def on_epoch_end(self, args, state, control, **kwargs):
        if not self.steps:
            sync(self.device)
            self.chunks.append((time.perf_counter() - self.start) / (state.global_step - self.first_step))


def main():
    args = parse_args(__doc__.splitlines()[0])
    use_cuda = torch.cuda.is_available()
    training_args = TrainingArguments(
        output_dir=str(args.run_dir) + "/trainer", per_device_train_batch_size=args.batch,
        learning_rate=args.lr, lr_scheduler_type="constant", num_train_epochs=args.epochs,
        max_steps=args.warmup + args.steps if args.steps else -1,
        eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, remove_unused_columns=False, use_cpu=not use_cuda, seed=0,
        # For a plain nn.Module the Trainer defaults to find_unused_parameters=True, an extra graph walk
        # every step; raw DDP does not do it, so neither does this level.
        ddp_find_unused_parameters=False,
        max_grad_norm=0.0,  # raw DDP does not clip; the Trainer still computes the norm every step
    )
    torch.manual_seed(0)
    X, y = mnist_tensors(train=True, root=args.data_dir)
    model = build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    clock = StepClock(args.warmup, args.steps, training_args.device)
    trainer = ClassifierTrainer(model=model, args=training_args, train_dataset=TensorDataset(X, y),
                                data_collator=collate, optimizers=(optimizer, None), callbacks=[clock])
    trainer.train()
    world = training_args.world_size
    per_epoch = len(trainer.get_train_dataloader())
    result = {"level": "trainer", "model": args.model, "world_size": world, "device": str(training_args.device),
              "parallel_mode": str(training_args.parallel_mode), "batch_per_rank": args.batch,
              "loader": figures(clock.chunks, per_epoch, world * args.batch, bool(args.steps),
                                args.steps or per_epoch * args.epochs)}
    if trainer.is_world_process_zero():
        write_result(args.out, result)
        print(f"trainer x{world} ({result['parallel_mode']}): {result['loader']['samples_per_s']:.0f} samples/s")


if __name__ == "__main__":
    main()
