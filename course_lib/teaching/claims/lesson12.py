"""What lesson 12 (device meshes) says about its run, checked from its artifacts (see course_lib.teaching.verify).

The 4 ranks' results are in ``runs/12_device_meshes/ranks-4.json`` and the 8 ranks' in ``ranks-8.json``
(``pool.save``); the tables the notebook drew are read too.
"""
from __future__ import annotations

import json

TOLERANCE = 1e-5  # one step against one process; ring attention against whole attention
TRAINED = 1e-4  # parameters after the training of section 2
SCIENTIFIC = r"(\d+(?:\.\d+)?e[-+]\d+)"
VALIDATION = 10_000


def _int(text) -> int:
    return int(str(text).replace(",", ""))


def check(run) -> None:
    four, eight = run.ranks("runs/12_device_meshes/ranks-4.json"), run.ranks("runs/12_device_meshes/ranks-8.json")
    _mesh(run, four)
    _two_d(run, four)
    _training(run, four)
    _ring(run, four)
    _accelerate(run, four)
    _three_d(run, eight)
    _choose(run)


def _mesh(run, four) -> None:
    where = four["where"]
    run.claim(four["nproc"] == 4 and all(
        r["its tp group"] == [2 * (r["rank"] // 2), 2 * (r["rank"] // 2) + 1]
        and r["its dp group"] == [r["rank"] % 2, r["rank"] % 2 + 2] for r in where),
        "the 2 x 2 mesh puts neighbouring ranks in a tp group (a row) and ranks 2 apart in a dp group (a column)")


def _two_d(run, four) -> None:
    from course_lib.model import RowTransformer

    layers = len(RowTransformer().blocks)
    worst, = run.found(r"gradients within " + SCIENTIFIC, run.titled("One FSDP2 x TP step on 2 x 2 ranks")["title"])
    rows = four["step_row"]
    every = max(r["max |gradient - reference|"] for r in rows)
    run.claim(float(worst) <= TOLERANCE and every <= TOLERANCE,
              f"FSDP2 x TP gives one process's gradients within {TOLERANCE:g} on every rank (got {worst} in the table, "
              f"{every:.1e} on the worst rank)")
    share = [r["parameter bytes here"] / r["parameter bytes whole"] for r in rows]
    run.claim(all(0.24 <= s <= 0.3 for s in share), f"each rank holds about a quarter of the parameters (got {share})")
    activation = run.parameters["BATCH"] // 2 * 28 * 64 * 4  # a row's half batch, 28 tokens, width 64, 4 bytes
    for r in rows:
        calls, sent = r["calls"], r["bytes"]
        run.claim(calls.get("all_reduce") == 4 * layers and sent.get("all_reduce") == 4 * layers * activation,
                  f"rank {r['rank']}: TP's all-reduces are 2 + 2 per block, each of the row's activations "
                  f"({activation:,} bytes) (got {calls.get('all_reduce')}, {sent.get('all_reduce')})")
        run.claim(r["sent"].get("all_reduce") == sent.get("all_reduce")
                  and r["sent"].get("_allgather_base_") * 2 == sent.get("_allgather_base_"),
                  f"rank {r['rank']}: in groups of 2, an all-reduce sends its whole tensor and an all-gather half")
        units = layers + 1
        run.claim(calls.get("_allgather_base_") == 2 * units and calls.get("_reduce_scatter_base_") == units,
                  f"rank {r['rank']}: FSDP gathers each of its {units} units for the forward and again for the "
                  f"backward and reduce-scatters its gradients once (got {calls})")


def _training(run, four) -> None:
    table = run.titled(f"{run.parameters['TRAIN_STEPS']} steps on 2 x 2 ranks")
    worst, = run.found(r"parameters within " + SCIENTIFIC, table["title"])
    every = four["trained"]
    run.claim(float(worst) <= TRAINED and all(r["max |parameter - reference|"] <= TRAINED for r in every),
              f"after training, FSDP2 x TP's parameters equal one process's within {TRAINED:g} (got {worst})")
    counts = {tuple(r["FSDP2 x TP"]) for r in every} | {tuple(r["one process"]) for r in every}
    run.claim(len(counts) == 1 and next(iter(counts))[1] == VALIDATION,
              f"the two rows' counts add up to all {VALIDATION:,} validation images, each seen once, on every rank, "
              f"and equal one process's (got {counts})")
    loaded, = run.found(r"in this notebook: ([\d,]+) of 10,000 right", run.cell_text("l12-2d-train-show"))
    run.claim(bool(every) and _int(loaded) == every[0]["FSDP2 x TP"][0],
              f"the saved checkpoint, loaded into a plain RowTransformer, scores what FSDP2 x TP scored ({loaded})")


def _ring(run, four) -> None:
    rows = four["ring_row"]
    n = four["nproc"]
    run.claim(len(rows) == n and all(r["max |output - whole attention|"] <= TOLERANCE for r in rows),
              f"ring attention gives whole attention's rows within {TOLERANCE:g} on every rank")
    run.claim(all(r["bytes sent"] == (n - 1) * r["keys and values of one share"] for r in rows),
              "each rank sends the keys and values of a share N - 1 times")


def _accelerate(run, four) -> None:
    results = [r["Accelerator(...)"] for r in four["asked"]]
    run.claim(all(r["same groups as section 1"] and r["build_device_mesh"].startswith("('dp_shard', 'tp')")
                  for r in four["asked"]),
              "ParallelismConfig's build_device_mesh gives section 1's groups, dimensions named dp_shard and tp")
    if four["backend"] == "gloo":
        run.claim(len(results) == 4 and all(r.startswith("ValueError") and "MULTI_CPU" in r for r in results),
                  f"on a CPU, Accelerate refuses ParallelismConfig, naming MULTI_CPU (got {results[:1]})")


def _three_d(run, eight) -> None:
    rows = eight["three_d"]
    worst, = run.found(r"every gradient within " + SCIENTIFIC, run.titled("One PP x FSDP x TP step")["title"])
    every = max(r["max |gradient - reference|"] for r in rows)
    run.claim(eight["nproc"] == 8 and float(worst) <= TOLERANCE and every <= TOLERANCE,
              f"PP x FSDP x TP on 2 x 2 x 2 gives one process's gradients within {TOLERANCE:g} on every rank "
              f"(got {worst} in the table, {every:.1e} on the worst rank)")
    run.claim(all(r["blocks"] == ([0, 1] if r["coordinate (pp, dp, tp)"][0] == 0 else [2, 3])
                  and len(r["micro-batch losses"]) == (2 if r["coordinate (pp, dp, tp)"][0] == 1 else 0) for r in rows),
              "each stage holds two blocks, and the last stage's ranks report their column's two micro-batch losses")
    by_column = {}
    for r in rows:
        if r["micro-batch losses"]:
            by_column.setdefault(r["coordinate (pp, dp, tp)"][1], set()).add(tuple(r["micro-batch losses"]))
    run.claim(len(by_column) == 2 and all(len(v) == 1 for v in by_column.values())
              and len({next(iter(v)) for v in by_column.values()}) == 2,
              "the ranks with the same dp index took the same half of the batch; the two dp indices differ")


def _choose(run) -> None:
    table = run.titled("64 GPUs of 80 GB")
    rows = table["rows"]
    fits = {(_int(r["pp"]), _int(r["dp"]), _int(r["tp"])): (float(r["GB per GPU"]), str(r["fits"]) == "True")
            for r in rows}
    run.claim(all(not ok for (pp, dp, tp), (_, ok) in fits.items() if tp == 1)
              and all(ok for (pp, dp, tp), (_, ok) in fits.items() if tp >= 2),
              "without TP no layout fits; with TP of 2 or more every one does")
    chosen = run.found(r"smallest pp: (\d+) x (\d+) x (\d+)", table["title"])
    run.claim(tuple(map(int, chosen)) == (1, 32, 2), f"the rule picks 1 x 32 x 2: no pipeline (got {chosen})")
    run.claim(all(len({gb for (pp, dp, t), (gb, _) in fits.items() if t == tp}) == 1 for tp in (1, 2, 4, 8)),
              "for a given TP degree, the number of pipeline stages does not change the memory per GPU")
    fake = {r["dimension"]: r for r in run.titled("The chosen mesh, built for 64 ranks")["rows"]}
    run.claim(_int(fake["tp"]["size"]) == 2 and json.loads(fake["tp"]["rank 0's group"]) == [0, 1]
              and str(fake["tp"]["within one node of 8"]) == "True" and _int(fake["dp"]["size"]) == 32,
              "the fake process group builds the chosen mesh for 64 ranks, its tp group within a node")
