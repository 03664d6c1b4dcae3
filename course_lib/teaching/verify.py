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
        tables = [out["metadata"]["course_table"] for cell in self.nb.cells if cell.cell_type == "code"
                  for out in cell.get("outputs", []) if "course_table" in out.get("metadata", {})]
        nonfinite = {"nan", "inf", "-inf"}  # how course_lib.display keeps a diverged number in JSON
        return [{**table, "rows": [{c: float(v) if isinstance(v, str) and v in nonfinite else v for c, v in row.items()}
                                   for row in table["rows"]]} for table in tables]

    def table(self, column: str) -> list[dict]:
        """The rows of the first table with this column."""
        for table in self.tables():
            if column in table["columns"]:
                return table["rows"]
        self.fail(f"no table with a column {column!r} was drawn")
        return []

    def titled(self, start: str, required: bool = True) -> dict | None:
        """The first table whose title starts with ``start``. Missing: KeyError (verify reports that the run did not
        draw it), or None where ``required`` is False."""
        for table in self.tables():
            if (table.get("title") or "").startswith(start):
                return table
        if required:
            raise KeyError(f"table titled {start!r}...")
        return None

    @staticmethod
    def found(pattern: str, text: str, required: bool = True) -> tuple | None:
        """The groups of ``pattern``'s first match in ``text``. No match: KeyError, or None where not ``required``."""
        match = re.search(pattern, text)
        if match is None and required:
            raise KeyError(f"printed line matching {pattern!r}")
        return match.groups() if match else None

    def scored(self, checkpoint: str | Path, batch: int = 1000) -> tuple[dict, int]:
        """A checkpoint the run saved (relative to the lesson's folder), loaded with ``weights_only=True`` into a plain
        MyModel, and its correct predictions on the 10,000 validation images, counted here in one process."""
        import torch

        from course_lib import MyModel
        from course_lib.data import mnist_tensors

        state = torch.load(self.folder / checkpoint, map_location="cpu", weights_only=True)
        model = MyModel()
        model.load_state_dict(state["model"])
        model.eval()
        images, labels = mnist_tensors(train=False)
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item()
                          for x, y in zip(images.split(batch), labels.split(batch)))
        return state, correct

    # -- what the launches left
    def events(self, run_dir: str, event: str = "epoch") -> list[dict]:
        from course_lib.metrics import read_metrics

        return read_metrics(self.folder / run_dir, event)

    def ranks(self, path: str) -> dict:
        """What every rank of a notebook's pool found, as ``pool.save(path, ...)`` left it (relative to the lesson's
        folder): ``{"nproc", "backend", name: [rank 0's, rank 1's, ...]}``."""
        import json

        return json.loads((self.folder / path).read_text())

    # -- verdicts
    def claim(self, holds: bool, claim: str) -> None:
        self.checked += 1
        if not holds:
            self.failures.append(claim)

    def fail(self, claim: str) -> None:
        self.claim(False, claim)


def claims_of(lesson: str):
    """The ``check(run)`` of the course's lesson ``lesson`` (``course_lib/teaching/claims/lessonNN.py``, or
    ``lessonNNa.py`` for the part ``NNa_...`` of a lesson read in several sittings), or None.

    Only a lesson of the course has claims: another notebook whose name starts with the same number (a copy, a
    test's small lesson) has none.
    """
    import importlib

    if not (ROOT / "notebooks" / f"{lesson}.ipynb").is_file():
        return None
    try:
        module = importlib.import_module(f"{__package__}.claims.lesson{lesson.split('_')[0]}")
    except ModuleNotFoundError:
        return None
    return module.check


def verify(lesson: str, nb, folder: str | Path = ROOT / "notebooks") -> int:
    """Check lesson ``lesson``'s claims against its executed notebook ``nb`` and the runs under ``folder``.

    Returns how many claims were checked (0 for a lesson without claims yet); raises ClaimFailed, listing every
    claim that does not hold.
    """
    check = claims_of(lesson)
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
