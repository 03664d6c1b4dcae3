"""What lesson 09c says about its run, checked from its artifacts (see course_lib.teaching.verify).

Section 1 ran in the pool, whose results reach the notebook only as the table it drew; section 2 launched the
scripts, whose metrics are under ``runs/09_sharding``.
"""
from __future__ import annotations


def _bytes_per_rank(cell: str) -> list[int]:
    return [int(b.replace(",", "")) for b in cell.split(" / ")]


def check(run) -> None:
    p = run.parameters
    _accelerate_in_the_pool(run)
    _launched(run, p)


def _accelerate_in_the_pool(run) -> None:
    table = run.titled("Asked for FSDP on ")
    backend, = run.found(r"ranks, (\w+), rank 0", table["title"])
    if backend == "gloo":
        run.claim(bool(table["rows"]) and not any(r["sharded"] for r in table["rows"]),
                  "on a CPU neither Accelerate nor the Trainer shards the model when asked for FSDP")


def _launched(run, p) -> None:
    table = [t for t in run.tables() if "the model became" in t["columns"]][0]
    rows = {r["script"].split(",")[0].split(" ")[0]: r for r in table["rows"]}
    backend, whole = run.found(r"processes, (\w+), MyModel \(([\d,]+) bytes of fp32 parameters\)", table["title"])
    whole = int(whole.replace(",", ""))
    fsdp_held = _bytes_per_rank(rows["train_fsdp.py"]["parameter bytes per rank"])
    run.claim(len(fsdp_held) == p["NPROC"] and sum(fsdp_held) == whole and max(fsdp_held) < whole,
              f"fully_shard's ranks hold shares that add up to the model's {whole:,} bytes (got {fsdp_held})")
    others = [rows["train_accelerate.py"], rows["train_trainer.py"]]
    run.claim(all(r["of 10,000"] == 10_000 for r in others)
              and all(run.events(f"runs/09_sharding/{name}")[-1]["val_count"] == 10_000 for name in ("accelerate", "trainer")),
              "the Accelerate and Trainer runs counted 10,000 validation samples")
    compared = [rows["train_fsdp.py"], rows["lesson"]]  # lesson 02's train.py
    run.claim(all(r["of 10,000"] == 10_000 for r in compared)
              and all(run.events(f"runs/09_sharding/{name}")[-1]["val_count"] == 10_000
                      for name in ("libraries-fsdp", "libraries-ddp")),
              "the FSDP2 and DDP runs they are compared with counted 10,000 validation samples")
    if backend == "gloo":
        run.claim(all(r["the model became"] == "DistributedDataParallel" for r in others),
                  "on a CPU, Accelerate's FSDP configuration file and the Trainer's fsdp arguments both give DDP")
        run.claim(all(_bytes_per_rank(r["parameter bytes per rank"]) == [whole] * p["NPROC"] for r in others),
                  "on a CPU, every rank of the Accelerate and Trainer runs holds the whole model")
