"""What lesson 02a says about its run, checked from its artifacts (see course_lib.teaching.verify)."""
from __future__ import annotations


def recipe_runs(run, folder: str) -> tuple[list, list]:
    """The epochs of the lesson's recipe and of the seed's, trained under ``folder`` (``runs/02_ddp``; part b trains
    them again under ``runs/02_ddp/results``), each with its number of epochs and the whole validation set counted."""
    p = run.parameters
    lesson, seed = run.events(f"{folder}/lesson"), run.events(f"{folder}/seed")
    run.claim(len(lesson) == p["EPOCHS"], f"the lesson's run logged {len(lesson)} epochs, not EPOCHS = {p['EPOCHS']}")
    run.claim(len(seed) == p["SEED_EPOCHS"], f"the seed's run logged {len(seed)} epochs, not {p['SEED_EPOCHS']}")
    run.claim(all(m["val_count"] == 10_000 for m in lesson + seed),
              "both runs counted 10,000 validation samples after every epoch")
    return lesson, seed


def check(run) -> None:
    p = run.parameters
    # Section 3: the lesson's recipe and the seed's, trained with the same script.
    lesson, seed = recipe_runs(run, "runs/02_ddp")
    if not lesson or not seed:
        return
    run.claim(lesson[0]["val_acc"] >= 0.90, f"one epoch of cross-entropy reaches 90% (got {lesson[0]['val_acc']:.4f})")
    run.claim(lesson[0]["val_acc"] > max(m["val_acc"] for m in seed),
              "the lesson's recipe after 1 epoch beats the seed's best epoch")

    first = run.number(r"The lesson's first step is (\d+) times the seed's")
    run.claim(first is not None and first > 10, f"the lesson's first SGD step is over 10x the seed's (printed {first})")

    grid = {(r["loss"], r["lr"], r["momentum"]): r[f"top-1 after {p['GRID_STEPS']} steps"]
            for r in run.table(f"top-1 after {p['GRID_STEPS']} steps")}
    if grid:
        mse = [acc for (loss, _, _), acc in grid.items() if loss == "MSE"]
        run.claim(grid[("cross-entropy", p["SEED_LR"], 0.0)] > grid[("MSE", p["SEED_LR"], 0.0)],
                  "at the seed's settings, cross-entropy alone learns more than MSE")
        run.claim(grid[("cross-entropy", p["LR"], p["MOMENTUM"])] > max(mse),
                  "the lesson's recipe beats every MSE recipe of the grid")

    # Section 4: the last checkpoint evaluated again at other world sizes.
    evals = [lesson[-1]] + [m for n in p["EVAL_NPROCS"] for m in run.events(f"runs/02_ddp/eval-{n}", "eval")[:1]]
    run.claim(len(evals) == 1 + len(p["EVAL_NPROCS"]) and all(m["val_count"] == 10_000 for m in evals),
              f"the checkpoint was evaluated at {p['EVAL_NPROCS']} processes too, 10,000 samples each time")
    corrects = [m["val_correct"] for m in evals]
    gloo = all(m["backend"] == "gloo" for m in evals)
    run.claim(max(corrects) - min(corrects) <= (0 if gloo else 10),
              f"every world size counts the same correct predictions on the CPU (got {corrects})")
