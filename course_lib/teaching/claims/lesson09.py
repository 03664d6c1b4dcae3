"""What lesson 09 says about its run, checked from its artifacts (see course_lib.teaching.verify).

Sections 1-4 ran in the pool, whose results reach the notebook only as the tables it drew and the lines it printed;
sections 5-6 launched the scripts, whose metrics are under ``runs/09_sharding``. The FSDP run's first metrics are
not: the resume of section 6 writes into the same run folder, so its first epochs are read from the table the
lesson drew of them.
"""
from __future__ import annotations

import math
import re

# What lesson 09's load_into must refuse, and the file each damage is in (the DAMAGE of its cell l09-torn).
DAMAGE = {"4 bytes flipped inside a tensor": "__0_0.distcp", "an emptied shard": "__1_0.distcp",
          "a shard cut in half": "__0_0.distcp", "a missing shard": "__1_0.distcp"}
SCIENTIFIC = r"(\d+(?:\.\d+)?e[-+]\d+)"


def _bytes_per_rank(cell: str) -> list[int]:
    return [int(b.replace(",", "")) for b in cell.split(" / ")]


def check(run) -> None:
    p = run.parameters
    _memory(run)
    _zero_and_fsdp(run)
    _communication(run)
    _accelerate_in_the_pool(run)
    _training(run, p)
    _checkpoints(run, p)
    _choosing(run)


def _memory(run) -> None:
    rows = run.table("formula, bytes per parameter")
    fits = []
    for r in rows:
        psi, formula = int(r["Ψ (parameters)"].replace(",", "")), [int(b) for b in r["formula, bytes per parameter"].split(" + ")]
        fits.append(float(r["state, bytes per parameter"]) == sum(formula) and all(
            abs(float(r[k]) - b * psi / 1e6) < 0.006 for k, b in zip(("parameters MB", "gradients MB", "optimizer MB"), formula)))
    run.claim(len(rows) == 6 and all(fits), "parameters, gradients and optimizer state measured in one step equal the "
              "formula (4+4+4, 4+4+8, 2+2+12 bytes per parameter) for both models")
    state = {(r["model"], r["optimizer"]): r["state, bytes per parameter"] for r in rows}
    run.claim(state.get(("Blocks", "Adam")) == state.get(("Blocks", "Adam, bf16 + fp32 master")) == "16.00",
              "Blocks' state is 16 bytes per parameter with fp32 Adam and with bf16 and an fp32 master copy alike")


def _zero_and_fsdp(run) -> None:
    table = run.titled("Blocks, Adam, ")
    worst, = run.found(SCIENTIFIC + r" \(checked", table["title"])
    run.claim(float(worst) <= 1e-6, f"ZeRO-1 by hand and ZeroRedundancyOptimizer equal DDP + Adam within 1e-6 at every "
              f"step and world size (got {worst})")
    largest = [float(r["largest rank / formula"]) for r in table["rows"] if r["optimizer"] != "DDP + Adam"]
    run.claim(bool(largest) and max(largest) < 1.1, f"ZeRO-1's fullest rank holds within 10% of 1/N of Adam's state "
              f"(got {max(largest, default=None)})")

    table = run.titled("FSDP2 against one process")
    grad, param = run.found(r"gradients within " + SCIENTIFIC + r", parameters within " + SCIENTIFIC, table["title"])
    run.claim(float(grad) < 1e-5 and float(param) < 1e-5, f"FSDP2's gradients and parameters equal one process's on the "
              f"whole batch within 1e-5 (got {grad}, {param})")
    cuts = []
    for r in table["rows"]:  # torch.chunk's cut of dim 0: ceil(rows / N) per rank, the rest to the last ranks
        rows, local = (int(run.found(pattern, r["blocks[0].linear1.weight"])[0]) for pattern in (r"\((\d+),", r"local \((\d+),"))
        share = math.ceil(rows / r["world size"])
        cuts.append(local == max(0, min(share, rows - r["rank"] * share)))
    run.claim(bool(cuts) and all(cuts), "each rank holds the rows of blocks[0].linear1.weight that torch.chunk gives it")


def _communication(run) -> None:
    table = run.table("all-gathers")
    by = {r["reshard_after_forward"].split()[0]: r for r in table}
    gathers = [by[k]["all-gathers"] for k in ("True", "None", "False")]
    run.claim(gathers[0] > gathers[1] > gathers[2], f"all-gathers per step: True > None (default) > False (got {gathers})")
    held = [float(by[k]["gathered MB held between forward and backward"]) for k in ("True", "None", "False")]
    run.claim(held[0] < held[1] < held[2], f"whole parameters held after the forward: True < None < False (got {held} MB)")
    root_held, root = run.found(r"it held ([\d.]+) MB after the forward, exactly the root's own embedding and head "
                             r"\(([\d.]+) MB\)", run.cell_text("l09-fsdp-comm-show"))
    run.claim(root_held == root, f"the default keeps exactly the root's parameters gathered ({root_held} and {root} MB)")
    backend, = run.found(r"\((\w+)\), rank 0", run.titled("One step of Blocks in ")["title"])
    if backend == "gloo":
        run.claim(all(r["gloo all-reduces"] == r["reduce-scatters"] for r in table),
                  "on gloo every reduce-scatter is carried out as an all-reduce")
    trace = {k: [int(n) for n in counts] for k, *counts in re.findall(
        r"reshard_after_forward=(\w+): forward (\d+) all-gathers, (\d+) reduce-scatters; backward (\d+) all-gathers, "
        r"(\d+) reduce-scatters", run.cell_text("l09-fsdp-comm-show"))}
    units = {k: by[k]["units"] for k in by}
    run.claim(len(trace) == 3 and all(trace[k][:2] == [units[k], 0] for k in trace),
              f"in the forward one all-gather per unit and no reduce-scatter ({trace})")
    run.claim(len(trace) == 3 and all(trace[k][3] == units[k] for k in trace),
              "in the backward one reduce-scatter per unit")
    run.claim(len(trace) == 3 and [trace[k][2] for k in ("True", "None", "False")] == [units["True"], units["None"] - 1, 0],
              "in the backward all units are gathered again with True, all but the root with the default, none with False")


def _accelerate_in_the_pool(run) -> None:
    table = run.titled("Asked for FSDP on ")
    backend, = run.found(r"ranks, (\w+), rank 0", table["title"])
    if backend == "gloo":
        run.claim(bool(table["rows"]) and not any(r["sharded"] for r in table["rows"]),
                  "on a CPU neither Accelerate nor the Trainer shards the model when asked for FSDP")


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
    if backend == "gloo":
        run.claim(all(r["the model became"] == "DistributedDataParallel" for r in others),
                  "on a CPU, Accelerate's FSDP configuration file and the Trainer's fsdp arguments both give DDP")
        run.claim(all(_bytes_per_rank(r["parameter bytes per rank"]) == [whole] * p["NPROC"] for r in others),
                  "on a CPU, every rank of the Accelerate and Trainer runs holds the whole model")


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


def _choosing(run) -> None:
    measured, formulas, worst = run.found(r"carried ([\d. /]+) MB per step \(True / default / False\) against the "
                                       r"formulas' ([\d. /]+) MB; the difference, at most ([\d.]+)%", run.text())
    m, v = ([float(x) for x in s.split(" / ")] for s in (measured, formulas))
    run.claim(len(m) == len(v) == 3 and all(a >= b for a, b in zip(m, v)) and float(worst) < 2,
              f"FSDP's collectives carry the formulas' bytes plus under 2% of padding ({measured} vs {formulas} MB)")
