"""Execute a notebook headlessly in a fresh kernel, with fast parameters injected after its parameters cell.

A notebook names its own fast settings in its metadata, ``{"course": {"fast_parameters": {"EPOCHS": 1}}}``,
so the tests and the grader use the same values, injected by the same code (``course_lib.teaching.notebooks``).
"""
from __future__ import annotations

from pathlib import Path

from course_lib.teaching.notebooks import execute, fast_parameters, inject_parameters, parameters_index  # noqa: F401 (re-exported)

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "test-output" / "executed"  # where tests/test_notebooks.py leaves each notebook it ran


def execute_notebook(path: Path, params: dict | None = None, timeout: int = 600, allow_errors=False):
    """Run ``path`` top to bottom in a fresh kernel with its cwd set to the notebook's folder."""
    return execute(path, params, timeout=timeout, allow_errors=allow_errors)


def has_outputs(nb) -> bool:
    return any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code")


def runs_with_one_lost_sample(lesson: str, run: str, tmp_path: Path, ignore=None) -> Path:
    """A copy of ``notebooks/runs/<lesson>`` under ``tmp_path`` in which the first epoch of ``run`` counted 9,999
    validation samples: what a claim about that run must notice. Returns ``tmp_path``, the folder to verify."""
    import json
    import shutil

    shutil.copytree(ROOT / "notebooks" / "runs" / lesson, tmp_path / "runs" / lesson, ignore=ignore)
    metrics = tmp_path / "runs" / lesson / run / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    next(r for r in records if r.get("event") == "epoch")["val_count"] = 9_999
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def executed(part: str):
    """A notebook (``"08a_build_ddp"``) as tests/test_notebooks.py executed it in this run, or a skip: the claims
    tests read it after tests/test_notebooks.py has run (checked when a test runs, not when it is collected)."""
    import nbformat
    import pytest

    if not (EXECUTED / f"{part}.ipynb").exists():
        pytest.skip(f"{part} has not been executed by tests/test_notebooks.py in this run")
    return nbformat.read(EXECUTED / f"{part}.ipynb", as_version=4)


def table_in(nb, cell_id: str, title: str = "") -> dict:
    """The table (``course_lib.show_table``'s record) that a cell of an executed notebook showed: the first whose
    title starts with ``title``."""
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    tables = [o["metadata"]["course_table"] for o in cell.outputs if "course_table" in o.get("metadata", {})]
    return next(table for table in tables if (table.get("title") or "").startswith(title))
