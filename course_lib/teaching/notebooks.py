"""Parameters of a notebook: its ``parameters`` cell, its fast settings, and the one way to override them.

A notebook has one code cell tagged ``parameters`` (papermill's convention) and names its own fast settings
in its metadata, ``{"course": {"fast_parameters": {"EPOCHS": 1}}}``. The tests and the grader override
them the same way: a cell assigning the values, inserted right after the ``parameters`` cell. No torch here.
"""
from __future__ import annotations

import copy

import nbformat

INJECTED_TAG = "injected-parameters"


def parameters_index(nb) -> int | None:
    """Index of the code cell tagged ``parameters``, or None."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return i
    return None


def fast_parameters(nb) -> dict:
    """The settings the notebook names for a fast run (``metadata.course.fast_parameters``)."""
    return dict(nb.metadata.get("course", {}).get("fast_parameters", {}))


def inject_parameters(nb, params: dict, by: str = "the tests", missing_ok: bool = False):
    """A copy of ``nb`` with a cell assigning ``params`` right after its ``parameters`` cell.

    ``by`` names who injected them (shown in the cell). Without a ``parameters`` cell: ValueError, or with
    ``missing_ok`` (a submission whose learner deleted it) the copy unchanged.
    """
    nb = copy.deepcopy(nb)
    if not params:
        return nb
    index = parameters_index(nb)
    if index is None:
        if missing_ok:
            return nb
        raise ValueError("the notebook has no cell tagged 'parameters' to inject fast settings after")
    source = f"# Injected by {by}: fast settings\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source, metadata={"tags": [INJECTED_TAG]}))
    return nb
