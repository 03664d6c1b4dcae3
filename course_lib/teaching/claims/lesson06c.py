"""What part 06c of lesson 06 says about its run, checked from its artifacts (see course_lib.teaching.verify).

Gradient accumulation and bf16 are read from the table and the line their in-process cells print; the three levels
from the metrics each launch logged.
"""
from __future__ import annotations

RUN = "runs/06_trainer"


def check(run) -> None:
    p = run.parameters
    _accumulation_bf16(run, p)
    _levels(run, p)


def _accumulation_bf16(run, p) -> None:
    rows = run.table("effective batch")
    run.claim(len(rows) == 4 and all(r["effective batch"] == 256 and r["optimizer steps"] == p["ACCUM_STEPS"]
                                     for r in rows),
              f"1 x 256 and 4 x 64 accumulated both make {p['ACCUM_STEPS']} optimizer steps of an effective 256")
    plain = [float(r["weights differ by"].split()[0]) for r in rows
             if r["model"] == "MyModel without BatchNorm" and "weights differ by" in r]
    run.claim(bool(plain) and max(plain) < 1e-4,
              f"without BatchNorm, accumulation ends where one big batch does, up to rounding ({plain})")
    run.claim("mixed precision bf16; output dtypes {'conv': torch.bfloat16, 'head': torch.bfloat16}; "
              "logits torch.float32" in run.cell_text("8fc2ef18"),
              "under bf16=True both convolutions compute in bfloat16 and compute_loss receives float32 logits")


def _levels(run, p) -> None:
    levels = {stem: run.events(f"{RUN}/{stem}") for stem in ("level_ddp", "level_accelerate", "level_trainer")}
    run.claim(all(len(records) == p["LEVEL_EPOCHS"] and all(r["val_count"] == 10_000 and r["world_size"] == p["NPROC"]
                                                         for r in records) for records in levels.values()),
              f"each level trained {p['LEVEL_EPOCHS']} epoch(s) on {p['NPROC']} processes and counted 10,000 images")
    run.claim(len({r["steps"] for records in levels.values() for r in records}) == 1,
              "the three levels took the same steps per epoch")
    run.claim(all(r["val_acc"] > 0.85 for records in levels.values() for r in records),
              "every level trains the model past 85%")
