"""Execute a notebook headlessly in a fresh kernel, with fast parameters injected after its parameters cell.

A notebook names its own fast settings in its metadata, ``{"course": {"fast_parameters": {"EPOCHS": 1}}}``,
so the tests and an instructor's ``--fast`` run use the same values and no test-only variable exists.
"""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def parameters_index(nb) -> int | None:
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return i
    return None


def fast_parameters(nb) -> dict:
    return dict(nb.metadata.get("course", {}).get("fast_parameters", {}))


def inject_parameters(nb, params: dict):
    """A copy of ``nb`` with a cell assigning ``params`` right after the ``parameters`` cell."""
    nb = copy.deepcopy(nb)
    if not params:
        return nb
    index = parameters_index(nb)
    if index is None:
        raise ValueError("the notebook has no cell tagged 'parameters' to inject fast settings after")
    source = "# Injected fast settings\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, cell)
    return nb


def execute_notebook(path: Path, params: dict | None = None, timeout: int = 600, allow_errors=False):
    """Run ``path`` top to bottom in a fresh kernel with its cwd set to the notebook's folder."""
    nb = nbformat.read(path, as_version=4)
    nb = inject_parameters(nb, fast_parameters(nb) if params is None else params)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def has_outputs(nb) -> bool:
    return any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code")
