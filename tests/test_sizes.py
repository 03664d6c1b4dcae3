"""``python -m course_lib sizes``: what a reader of each lesson reads, counted from the notebook's file."""
import subprocess
import sys

import nbformat

from course_lib.teaching.sizes import measure
from notebook_runner import ROOT
from course_lib.scripts import LESSON_GLOB


def test_prose_visible_code_asserts_and_repeated_base_are_counted_apart(tmp_path):
    base = ("%%write_script runs/x/base.py\nimport sys\nimport os\n# >>> inherited: the base's own region\n"
            "print('inherited')\n# <<< inherited\nprint('base again')\nprint('end')\n")
    derived = ("%%write_script runs/x/derived.py --base runs/x/base.py\nimport sys\nimport os\n\n"
               "# >>> change: why\nprint('new')\n# <<< change\n# ...\n# <<< inherited\n"
               "# >>> late: after the base's region\nprint('late')\n# <<< late\nprint('base again')\n# ...\n")
    cells = [nbformat.v4.new_markdown_cell("Four words of prose."),
             nbformat.v4.new_code_cell("x = 1\n\nassert x == 1\n"),
             nbformat.v4.new_code_cell("hidden = True\nassert hidden\n", metadata={"jupyter": {"source_hidden": True}}),
             nbformat.v4.new_code_cell("also_hidden = 1\n", metadata={"tags": ["remove-input"]}),
             nbformat.v4.new_code_cell(base, metadata={"tags": ["remove-input"]}),
             nbformat.v4.new_code_cell(derived)]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    size = measure(path)
    assert (size.prose_words, size.visible_code_lines, size.visible_asserts) == (4, 2 + 13, 1)
    # where each region goes: `import os` before `change`; before `late`, the base's `# <<< inherited` (a marker
    # of the base, so the anchor reaches past it, to `# ...`, which stores nothing); `print('base again')` after it
    assert size.anchor_lines == 3
    assert size.repeated_base_lines == 1  # `import sys`: a line of the base stored again for nothing
    assert not size.within_bar


def test_the_command_prints_a_row_per_lesson():
    done = subprocess.run([sys.executable, "-m", "course_lib", "sizes"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob(LESSON_GLOB))
    assert [line.split()[0] for line in done.stdout.splitlines()[2:]] == lessons
