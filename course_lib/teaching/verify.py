"""What a lesson says about its run, checked after the notebook ran, from what the run left behind.

A lesson's sentences about its results ("every validation image counted once", "cross-entropy wins") must hold in
the run the reader sees, whatever its settings. They used to be asserts between the ideas; here they are checked
from the run's artifacts instead: the executed notebook (its printed text, and the rows of every table
``show_table`` drew, which travel in the output's metadata), the metrics each launch logged, and the checkpoints,
which a check may load and evaluate itself. The tests call ``verify`` after running a lesson in its fast settings;
the book calls it after running each lesson, so the same claims are checked in whatever settings it ran.

  python -m course_lib.teaching.verify EXECUTED.ipynb [LESSON_FOLDER]

checks an executed copy (for example one the tests left in ``test-output/executed``) against the runs in
LESSON_FOLDER (default ``notebooks/``).
"""
from __future__ import annotations

import ast
import math
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


class ClaimFailed(AssertionError):
    """A lesson's claim does not hold in the run; the message lists every claim that failed."""


class Run:
    """One executed lesson: its parameters, its printed text, its tables, and the runs under its folder."""

    def __init__(self, nb, folder: Path):
        self.nb, self.folder = nb, Path(folder)
        self.failures: list[str] = []
        self.checked = 0

    # -- what the notebook shows
    @property
    def parameters(self) -> dict:
        """The parameters cell's values, with the ones injected for this run (fast settings) on top."""
        values = {}
        for cell in self.nb.cells:
            tags = cell.metadata.get("tags", [])
            if cell.cell_type == "code" and ("parameters" in tags or "injected-parameters" in tags):
                for node in ast.parse(cell.source).body:
                    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                        try:
                            values[node.targets[0].id] = ast.literal_eval(node.value)
                        except ValueError:
                            pass
        return values

    def text(self) -> str:
        """Everything the cells printed, in order."""
        return "\n".join(out.get("text", "") for cell in self.nb.cells if cell.cell_type == "code"
                         for out in cell.get("outputs", []) if out.get("output_type") == "stream")

    def cell_text(self, cell_id: str) -> str:
        """What one cell printed, and the text of the Markdown it displayed."""
        for cell in self.nb.cells:
            if cell.get("id") == cell_id:
                return "\n".join(out.get("text", "") or out.get("data", {}).get("text/markdown", "")
                                 for out in cell.get("outputs", []))
        self.fail(f"the lesson has no cell {cell_id!r}")
        return ""

    def number(self, pattern: str) -> float | None:
        """The first number a printed line gives where ``pattern`` (a regex with one group) matches; None if none."""
        found = re.search(pattern, self.text())
        return float(found.group(1)) if found else None

    def tables(self) -> list[dict]:
        """Every table the lesson drew: {"title", "columns", "rows"}, in order."""
        return [out["metadata"]["course_table"] for cell in self.nb.cells if cell.cell_type == "code"
                for out in cell.get("outputs", []) if "course_table" in out.get("metadata", {})]

    def table(self, column: str) -> list[dict]:
        """The rows of the first table with this column."""
        for table in self.tables():
            if column in table["columns"]:
                return table["rows"]
        self.fail(f"no table with a column {column!r} was drawn")
        return []

    # -- what the launches left
    def events(self, run_dir: str, event: str = "epoch") -> list[dict]:
        from course_lib.metrics import read_metrics

        return read_metrics(self.folder / run_dir, event)

    # -- verdicts
    def claim(self, holds: bool, claim: str) -> None:
        self.checked += 1
        if not holds:
            self.failures.append(claim)

    def fail(self, claim: str) -> None:
        self.claim(False, claim)


def _lesson_00(run: Run) -> None:
    data = run.cell_text("77284c4d")
    run.claim("X_val (10000, 1, 28, 28)" in data and "y_val (10000,)" in data,
              "the validation set is 10,000 images of 1x28x28 with 10,000 labels")
    run.claim("MyModel's flatten(1): (1, 10)" in run.cell_text("94e3b017"),
              "MyModel keeps the batch dimension for a batch of one: (1, 10)")
    rows = [line.strip("| ").split(" | ") for line in run.cell_text("743a47b2").splitlines()
            if line.startswith("| ") and not line.startswith("| RANK")]
    world = len(rows)
    run.claim(world >= 2 and sorted(int(r[0]) for r in rows) == list(range(world)),
              f"one table row per rank, ranks 0..{world - 1}")
    run.claim(all(int(r[2]) == world and float(r[7]) == world * (world - 1) / 2 for r in rows),
              "every rank saw the world size and received the same sum 0+...+(W-1)")
    plain = [line for line in run.cell_text("plain-py").splitlines() if line.startswith("RANK=")]
    fields = dict(item.split("=", 1) for item in plain[-1].split()) if plain else {}
    run.claim(fields.get("RANK") == "0" and fields.get("WORLD_SIZE") == "1" and float(fields.get("sum_of_ranks", -1)) == 0,
              "plain python runs the script as a world of one whose all_reduce returns its own number")


def _lesson_02(run: Run) -> None:
    p = run.parameters
    lesson, seed = run.events("runs/02_ddp/lesson"), run.events("runs/02_ddp/seed")
    run.claim(len(lesson) == p["EPOCHS"], f"the lesson's run logged {len(lesson)} epochs, not EPOCHS = {p['EPOCHS']}")
    run.claim(len(seed) == p["SEED_EPOCHS"], f"the seed's run logged {len(seed)} epochs, not {p['SEED_EPOCHS']}")
    run.claim(all(m["val_count"] == 10_000 for m in lesson + seed),
              "both runs counted 10,000 validation samples after every epoch")
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

    evals = [lesson[-1]] + [m for n in p["EVAL_NPROCS"] for m in run.events(f"runs/02_ddp/eval-{n}", "eval")[:1]]
    run.claim(len(evals) == 1 + len(p["EVAL_NPROCS"]) and all(m["val_count"] == 10_000 for m in evals),
              f"the checkpoint was evaluated at {p['EVAL_NPROCS']} processes too, 10,000 samples each time")
    corrects = [m["val_correct"] for m in evals]
    gloo = all(m["backend"] == "gloo" for m in evals)
    run.claim(max(corrects) - min(corrects) <= (0 if gloo else 10),
              f"every world size counts the same correct predictions on the CPU (got {corrects})")

    # The checkpoint, loaded here into a plain MyModel and evaluated in this process.
    import torch

    from course_lib import MyModel
    from course_lib.data import mnist_tensors

    state = torch.load(run.folder / f"runs/02_ddp/lesson/checkpoints/checkpoint-{p['EPOCHS'] - 1}.pt",
                       map_location="cpu", weights_only=True)
    run.claim(not any(k.startswith("module.") for k in state["model"]), "the checkpoint holds the unwrapped model")
    model = MyModel()
    model.load_state_dict(state["model"])
    model.eval()
    images, labels = mnist_tensors(train=False)
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in zip(images.split(256), labels.split(256)))
    run.claim(correct == lesson[-1]["val_correct"] if gloo else abs(correct - lesson[-1]["val_correct"]) <= 10,
              f"one process scores the checkpoint as the distributed evaluation did ({correct} vs "
              f"{lesson[-1]['val_correct']})")
    buffers = state["optimizer"]["state"]
    run.claim(len(buffers) == len(list(model.parameters())) and all("momentum_buffer" in s for s in buffers.values()),
              "the checkpoint holds a momentum buffer for each parameter tensor")
    ratio = run.number(r"the first step after the resume is ([\d.]+)x")
    run.claim(ratio is not None and abs(ratio - 1) > 0.05,
              f"a resume with the optimizer's state takes another first step than a fresh optimizer ({ratio}x)")

    panel = run.events("runs/02_ddp/panel")
    run.claim([m["val_count"] for m in panel] == [10_000], "the launch panel's run finished its epoch and evaluated")

    rows = run.table("samples seen")
    run.claim(len(rows) >= 2 and len({r["samples seen"] for r in rows}) == 1,
              "the global-batch runs all saw the same number of samples")
    for row in rows:
        found = re.match(r"(\d+) process(?:es)?, batch (\d+)", row["recipe"])
        runs = run.events(f"runs/02_ddp/batch/{found.group(1)}x{found.group(2)}") if found else []
        run.claim(bool(runs) and runs[-1]["steps"] == row["steps"] and runs[-1]["val_count"] == 10_000,
                  f"the run '{row['recipe']}' took its {row['steps']} steps and evaluated 10,000 samples")
    run.claim(math.isfinite(sum(r["val top-1"] for r in rows)), "every global-batch run has an accuracy")


LESSONS = {"00_setup": _lesson_00, "02_ddp": _lesson_02}


def verify(lesson: str, nb, folder: str | Path = ROOT / "notebooks") -> int:
    """Check lesson ``lesson``'s claims against its executed notebook ``nb`` and the runs under ``folder``.

    Returns how many claims were checked (0 for a lesson without a verify function yet); raises ClaimFailed,
    listing every claim that does not hold.
    """
    check = LESSONS.get(lesson)
    if check is None:
        return 0
    run = Run(nb, Path(folder))
    try:
        check(run)
    except (KeyError, IndexError, FileNotFoundError) as error:  # an artifact is missing: the run did not happen
        run.fail(f"the run left no {error!s} where the lesson reads it")
    if run.failures:
        raise ClaimFailed(f"{lesson}: {len(run.failures)} of {run.checked} claims do not hold in this run:\n"
                          + "\n".join(f"  - {claim}" for claim in run.failures))
    return run.checked


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    path = Path(argv[0])
    folder = Path(argv[1]) if len(argv) > 1 else ROOT / "notebooks"
    try:
        count = verify(path.stem, nbformat.read(path, as_version=4), folder)
    except ClaimFailed as failed:
        print(failed)
        return 1
    print(f"{path.stem}: {count} claims checked, all hold")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
