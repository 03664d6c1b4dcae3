"""A learner's setting the lesson cannot run with stops at the cell that first uses it, naming the setting."""
import ast

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from course_lib.teaching.verify import ROOT

GUARDS = {  # lesson, setting: (values that run, values refused); other names as in the lesson's defaults
    ("03a_pitfalls_setup_and_evaluation", "LOOP_EPOCHS"): ([2, 5], [1, 0]),
    ("04a_torchrun_restarts", "FAIL_AT_EPOCH"): ([0, 1], [2, -1, 5]),
}


def _guard(lesson, name):
    """The lesson's first statement that raises ValueError about ``name``, and its parameters cell's namespace."""
    nb = nbformat.read(ROOT / "notebooks" / f"{lesson}.ipynb", as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    namespace = {}
    exec(params.source, namespace)
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.source.startswith("%%"):
            continue
        for node in ast.parse(TransformerManager().transform_cell(cell.source)).body:  # magics as Python
            if isinstance(node, ast.If) and name in ast.unparse(node.test) and "ValueError" in ast.unparse(node):
                return compile(ast.Module([node], []), lesson, "exec"), namespace
    raise AssertionError(f"{lesson} has no ValueError guard on {name}")


@pytest.mark.parametrize(("lesson", "name"), sorted(GUARDS))
def test_a_setting_the_lesson_cannot_run_with_is_refused_naming_it(lesson, name):
    guard, defaults = _guard(lesson, name)
    good, bad = GUARDS[lesson, name]
    for value in good:
        exec(guard, {**defaults, name: value})
    for value in bad:
        with pytest.raises(ValueError, match=rf"{name} is {value}: set it to"):
            exec(guard, {**defaults, name: value})
