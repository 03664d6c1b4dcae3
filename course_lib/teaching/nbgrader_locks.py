"""nbgrader's autograde, failing closed: a submission whose read-only cells lost their nbgrader metadata is refused.

nbgrader puts a read-only cell back by its ``grade_id`` (and re-adds a missing test cell), but a cell whose nbgrader
metadata was removed has no ``grade_id``: autograde would run it as the student wrote it, in the kernel the checks
then run in. The course's ``nbgrader_config.py`` adds this step after nbgrader's own ``OverwriteCells`` so that such
a notebook is not graded at all. Imported only by nbgrader (which is in the test extra).
"""
from __future__ import annotations

from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor


class LockedCellsMissing(ValueError):
    """A submission lacks read-only cells of its release (deleted, or their nbgrader metadata removed)."""


class RequireLockedCells(NbGraderPreprocessor):
    """Refuse a notebook in which a read-only cell of the release no longer carries its ``grade_id``."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gradebook:
            release = gradebook.find_notebook(info["notebook"], info["assignment"])
            locked = {cell.name for cell in release.source_cells if cell.locked}
        present = {cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") for cell in nb.cells}
        missing = sorted(locked - present)
        if missing:
            raise LockedCellsMissing(
                f"{info['notebook']}: the read-only cell(s) {', '.join(missing)} are missing or lost their nbgrader "
                "metadata, so nbgrader cannot put them back and would run them as edited. This notebook is not "
                "graded; grade it with `python -m course_lib grade`, which takes those cells from the release.")
        return nb, resources
