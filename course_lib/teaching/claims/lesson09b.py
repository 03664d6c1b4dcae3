"""What lesson 09b says about its run, checked from its artifacts (see course_lib.teaching.verify).

Its runs' metrics are under ``runs/09_sharding``. The FSDP run's first metrics are not: the resume of section 2
writes into the same run folder, so its first epochs are read from the table the lesson drew of them.
"""
from __future__ import annotations

import re

# What lesson 09b's load_into must refuse, and the file each damage is in (the DAMAGE of its cell l09-torn).
DAMAGE = {"4 bytes flipped inside a tensor": "__0_0.distcp", "an emptied shard": "__1_0.distcp",
          "a shard cut in half": "__0_0.distcp", "a missing shard": "__1_0.distcp"}
SCIENTIFIC = r"(\d+(?:\.\d+)?e[-+]\d+)"


def _bytes_per_rank(cell: str) -> list[int]:
    return [int(b.replace(",", "")) for b in cell.split(" / ")]


def check(run) -> None:
    p = run.parameters
    _training(run, p)
    _checkpoints(run, p)


def _training(run, p) -> None:
    records = run.titled("FSDP2 on MNIST")["rows"]
    run.claim(bool(records) and all(r["val_count"] == 10_000 for r in records),
              "the FSDP2 run counted 10,000 validation samples after every epoch")
    floor = 0.90 if p["MAX_STEPS"] is None else 0.80
    run.claim(bool(records) and records[-1]["val_acc"] >= floor,
              f"the FSDP2 run reaches {floor:.0%} top-1 (got {records[-1]['val_acc'] if records else None})")

    compared = {r["script"]: r for r in run.table("correct of 10,000")}
    ddp, fsdp = compared["lesson 02's train.py (DDP)"], compared["train_fsdp.py (FSDP2)"]
    weights, = run.found(r"largest difference between the two final models' weights: " + SCIENTIFIC, run.text())
    ddp_metrics = run.events("runs/09_sharding/ddp")
    run.claim(abs(ddp["correct of 10,000"] - fsdp["correct of 10,000"]) <= 10 and float(weights) < 1e-4
              and bool(ddp_metrics) and ddp_metrics[-1]["val_correct"] == ddp["correct of 10,000"],
              f"DDP and FSDP2 end at the same model: weights within 1e-4 (got {weights}), correct counts within 10")

    correct, logged = run.found(r"a plain MyModel from checkpoint-\d+\.pt: ([\d,]+) of 10,000 correct .*the run logged "
                             r"([\d,]+)", run.text())
    run.claim(correct == logged == f"{fsdp['correct of 10,000']:,}",
              f"a plain MyModel scores the plain checkpoint as the run did ({correct} vs {logged})")


def _checkpoints(run, p) -> None:
    import json

    files = [r["file"] for r in run.table("SHA-256 in manifest.json")]
    run.claim(len([f for f in files if f.endswith(".distcp")]) == p["NPROC"],
              f"the sharded checkpoint has one shard file per rank of the {p['NPROC']} that saved (got {files})")
    folder = run.folder / "runs/09_sharding/fsdp/checkpoints" / f"dcp-{p['EPOCHS'] - 1}"
    manifest = json.loads((folder / "manifest.json").read_text())["files"]
    run.claim(sorted(manifest) == [f for f in files if f != "manifest.json"],
              "manifest.json lists every file of the checkpoint but itself")

    after = run.titled("resumed from ")["rows"]
    run.claim([r["epoch"] for r in after] == [p["EPOCHS"]] and after[0]["world_size"] == p["RESUME_NPROC"],
              f"the resume ran epoch {p['EPOCHS']} on {p['RESUME_NPROC']} processes")
    resumed = run.cell_text("l09-resume")
    run.claim(after[0]["val_count"] == 10_000 and f"resumed from runs/09_sharding/fsdp/checkpoints/dcp-{p['EPOCHS'] - 1}"
              in resumed, "the resumed run said it resumed from the checkpoint and counted 10,000 validation samples")
    held, = run.found(r"the ranks held ([\d, /]+) parameter bytes", resumed)

    import torch

    from course_lib import MyModel

    def chunk_rows(rows, n):
        pieces = [len(piece) for piece in torch.chunk(torch.arange(rows), n)]
        return pieces + [0] * (n - len(pieces))

    n = p["RESUME_NPROC"]
    expected = [sum(chunk_rows(t.shape[0], n)[r] * t[0].numel() * t.element_size() for t in MyModel().parameters())
                for r in range(n)]
    run.claim(_bytes_per_rank(held.strip()) == expected,
              f"on {n} ranks each holds torch.chunk's cut of every parameter ({held.strip()} bytes, expected {expected})")

    convert = re.findall(r"(dcp\.load|dcp_to_torch_save): largest difference from checkpoint-\d+\.pt " + SCIENTIFIC,
                         run.cell_text("l09-convert"))
    run.claim(len(convert) == 2 and all(float(d) == 0.0 for _, d in convert),
              "dcp.load and dcp_to_torch_save both give exactly the plain checkpoint's weights")

    torn = run.cell_text("l09-torn")
    name, changed = run.found(r"4 bytes flipped inside (\S+) in __0_0\.distcp: no error; the loaded (.+?) differs", torn)
    run.claim(name == changed, f"dcp.load takes 4 flipped bytes silently: only {name} changes (got {changed})")
    refusals = {what: re.search(rf"^{re.escape(what)}, load_into: (.*)$", torn, re.M) for what in DAMAGE}
    run.claim(all(found and found.group(1).startswith(("RuntimeError", "FileNotFoundError")) for found in refusals.values()),
              "load_into refuses all four damaged checkpoints")
    run.claim(all(found and at_fault in found.group(1) and "earlier checkpoint" in found.group(1)
                  for found, at_fault in zip(refusals.values(), DAMAGE.values())),
              "each refusal names the file at fault and says to resume from an earlier checkpoint")
    run.claim(f"after all {len(DAMAGE)}, the model is unchanged" in torn, "the refused loads leave the model unchanged")
    run.claim("the intact checkpoint, load_into: the saved weights exactly: True" in torn,
              "the intact checkpoint loads the saved weights exactly")
    line = re.search(r"^a folder without manifest\.json, the script's load_checkpoint: (.*)$", torn, re.M)
    run.claim(bool(line) and line.group(1) != "accepted" and "manifest.json" in line.group(1),
              "the script's load_checkpoint refuses a folder without manifest.json, naming it")
