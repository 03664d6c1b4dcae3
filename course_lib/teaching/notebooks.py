"""Parameters of a notebook: its ``parameters`` cell, its fast settings, and the one way to override them.

A notebook has one code cell tagged ``parameters`` (papermill's convention) and names its own fast settings
in its metadata, ``{"course": {"fast_parameters": {"EPOCHS": 1}}}``. The tests and the grader override
them the same way: a cell assigning the values, inserted right after the ``parameters`` cell. ``execute`` runs a
notebook so, recording where and how. No torch at import.
"""
from __future__ import annotations

import copy
import os

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


def execute(path, params: dict | None = None, timeout: int = 600, allow_errors: bool = False, by: str = "the tests"):
    """Run the notebook at ``path`` top to bottom in a fresh kernel, cwd its folder, with ``params`` (default:
    its fast settings) injected after its parameters cell; return the executed notebook.

    It carries a record of the run in ``metadata.course.executed``: the source's sha256 (so an executed copy is
    known to match the committed lesson), the parameters, the seconds taken, when it finished, the machine and
    its load average when the run started (its outputs' timings depend on both).
    """
    import datetime
    import hashlib
    import time
    from pathlib import Path

    from nbclient import NotebookClient

    from ..devices import machine_summary

    path = Path(path)
    source = path.read_bytes()
    nb = nbformat.reads(source.decode("utf-8"), as_version=4)
    params = fast_parameters(nb) if params is None else params
    nb = inject_parameters(nb, params, by=by)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    start = time.monotonic()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    nb.metadata.setdefault("course", {})["executed"] = {
        "source_sha256": hashlib.sha256(source).hexdigest(), "parameters": params,
        "seconds": round(time.monotonic() - start, 1),
        "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_summary(), "load_average_at_start": load, "cpu_count": os.cpu_count()}
    return nb

