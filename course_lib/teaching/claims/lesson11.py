"""What lesson 11 (pipeline parallel) says about its run, checked from its artifacts (see course_lib.teaching.verify).

Everything ran in the pool of ranks; what every rank found is in ``runs/11_pipeline_parallel/ranks.json``
(``pool.save``), read here next to the tables the notebook drew.
"""
from __future__ import annotations

import json

TOLERANCE = 1e-5  # one step of a pipeline against one process
TRAINED = 1e-4  # parameters and losses after the training of section 5
BUBBLE_AT_ONE = 0.05  # one micro-batch: (p-1)/p of the step is idle, whatever the stages cost
BUBBLE_NEAR = 0.15  # any m: the measured bubble stays this close to the formula on this machine
SCIENTIFIC = r"(\d+(?:\.\d+)?e[-+]\d+)"
RANKS = "runs/11_pipeline_parallel/ranks.json"
VALIDATION = 10_000
MICRO = 4  # sections 2 and 4 cut the batch into 4 micro-batches
LIBRARY = ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B")


def _int(text) -> int:
    return int(str(text).replace(",", ""))


def check(run) -> None:
    ranks = run.ranks(RANKS)
    p = ranks["nproc"]
    _cut(run, p)
    _by_hand(run, ranks, p)
    _bubble(run, p)
    _library(run, ranks, p)
    _training(run, ranks)


def _cut(run, p) -> None:
    from course_lib.model import RowTransformer

    whole = RowTransformer(layers=4)
    table = run.titled(f"RowTransformer(layers=4) cut into {p} stages")
    rows = table["rows"]
    run.claim(len(rows) == p and sum(_int(r["parameters"]) for r in rows) == sum(t.numel() for t in whole.parameters())
              and all(len(json.loads(r["blocks"])) == 4 // p for r in rows),
              f"the cut gives each of the {p} stages 4/{p} blocks, and the stages' parameters add up to the model's")


def _by_hand(run, ranks, p) -> None:
    worst, = run.found(r"every gradient within " + SCIENTIFIC, run.titled("One step by hand on ")["title"])
    every = [r for rows in ranks["hand_rows"] for r in rows]
    run.claim(float(worst) <= TOLERANCE and len(every) == 2 * p
              and all(r["max |gradient - reference|"] <= TOLERANCE for r in every)
              and all(r["|loss - reference|"] is not None and r["|loss - reference|"] <= TOLERANCE
                      for r in every if r["rank"] == p - 1),
              f"GPipe and 1F1B by hand give one process's loss and gradients within {TOLERANCE:g} on every rank "
              f"(got {worst})")
    kept = {(r["schedule"], r["rank"]): r["most micro-batches kept"] for r in every}
    run.claim(all(kept[("gpipe", r)] == MICRO for r in range(p))
              and all(kept[("one_f_one_b", r)] == min(p - r, MICRO) for r in range(p)),
              f"GPipe keeps all {MICRO} micro-batches on every stage; 1F1B at most p - rank: p on the first, one on "
              f"the last (got {kept})")


def _bubble(run, p) -> None:
    rows = run.titled(f"The bubble on {p} stages")["rows"]
    micro = sorted(run.parameters["MICRO"])
    for schedule in ("gpipe", "one_f_one_b"):
        mine = {_int(r["micro-batches m"]): r for r in rows if r["schedule"] == schedule}
        measured = {m: float(mine[m]["bubble measured (median)"]) for m in micro if m in mine}
        formula = {m: (p - 1) / (m + p - 1) for m in micro}
        run.claim(set(measured) == set(micro), f"{schedule}: a bubble measured for every m in MICRO")
        if p == 1 or set(measured) != set(micro):
            continue
        run.claim(abs(measured[1] - formula[1]) <= BUBBLE_AT_ONE if 1 in measured else True,
                  f"{schedule}: with one micro-batch, (p-1)/p of the step is idle (got {measured.get(1)})")
        run.claim(all(abs(measured[m] - formula[m]) <= BUBBLE_NEAR for m in micro),
                  f"{schedule}: the measured bubble stays within {BUBBLE_NEAR} of (p-1)/(m+p-1) (got {measured})")
        run.claim(measured[micro[-1]] < measured[micro[0]],
                  f"{schedule}: the bubble falls as the micro-batches grow in number (got {measured})")
        first = {_int(r["micro-batches m"]): _int(r["most kept, rank 0"]) for r in mine.values()}
        run.claim(all(first[m] == (m if schedule == "gpipe" else min(p, m)) for m in micro),
                  f"{schedule}: rank 0 keeps {'m' if schedule == 'gpipe' else 'min(p, m)'} micro-batches (got {first})")


def _library(run, ranks, p) -> None:
    worst, = run.found(r"every gradient within " + SCIENTIFIC, run.titled("PyTorch's schedules, one step on ")["title"])
    every = [r for rows in ranks["library_rows"] for r in rows]
    library = LIBRARY if 4 % (2 * p) == 0 else LIBRARY[:2]  # interleaving needs 2p stages of the model's 4 blocks
    run.claim(float(worst) <= TOLERANCE and len(every) == len(library) * p and {r["schedule"] for r in every} == set(library)
              and all(r["max |gradient - reference|"] <= TOLERANCE for r in every)
              and all(r["|loss - reference|"] <= TOLERANCE for r in every if r["rank"] == p - 1),
              f"PyTorch's GPipe, 1F1B and interleaved 1F1B give one process's loss and gradients within {TOLERANCE:g} "
              f"on every rank (got {worst})")
    per = 4 // (2 * p) if 4 % (2 * p) == 0 else None
    run.claim(per is None or all(r["blocks here"] == list(range(r["rank"] * per, (r["rank"] + 1) * per))
                                 + list(range((r["rank"] + p) * per, (r["rank"] + p + 1) * per))
                                 for r in every if r["schedule"] == "ScheduleInterleaved1F1B"),
              "interleaved 1F1B gives rank r the stages r and r + p")
    times = {r["schedule"]: r for r in run.titled(f"{run.parameters['BATCH']} images in 8 micro-batches")["rows"]}
    run.claim(set(times) == set(library) and (len(library) == 2 or float(
        times["ScheduleInterleaved1F1B"]["bubble by the formula"]) < float(times["Schedule1F1B"]["bubble by the formula"])),
              "the schedules are timed side by side, and interleaving halves the bubble by the formula")


def _training(run, ranks) -> None:
    table = run.titled(f"{run.parameters['TRAIN_STEPS']} steps on ")
    worst, = run.found(r"parameters within " + SCIENTIFIC, table["title"])
    every = ranks["trained"]
    run.claim(float(worst) <= TRAINED and all(r["max |parameter - reference|"] <= TRAINED and r["names"] for r in every),
              f"after training, the stages put together equal one process's model within {TRAINED:g}, name for name "
              f"(got {worst})")
    counts = {tuple(r["pipeline"]) for r in every} | {tuple(r["one process"]) for r in every}
    run.claim(len(counts) == 1 and next(iter(counts))[1] == VALIDATION,
              f"every rank gets the pipeline's count of all {VALIDATION:,} validation images, each seen once, and it is "
              f"the one process's (got {counts})")
    if ranks["backend"] == "gloo":
        run.claim(all(r["max |parameter - reference|"] == 0 for r in every)
                  and all(a == b for a, b in every[-1]["losses"]),
                  "on a CPU, the pipeline and the one process accumulating the same micro-batches agree to the bit")
    text = run.cell_text("l11-train-show")
    loss, = run.found(r"The two losses differ by at most " + SCIENTIFIC, text)
    run.claim(float(loss) <= TRAINED and all(abs(a - b) <= TRAINED for a, b in every[-1]["losses"])
              and len(every[-1]["losses"]) == run.parameters["TRAIN_STEPS"],
              f"the losses of every step agree within {TRAINED:g} (got {loss})")
    loaded, = run.found(r"in this notebook: ([\d,]+) of 10,000 right", text)
    run.claim(bool(every) and _int(loaded) == every[0]["pipeline"][0],
              f"the saved checkpoint, loaded into a plain RowTransformer, scores what the pipeline scored ({loaded})")
