"""ruff, configured in pyproject.toml, finds nothing: in course_lib, the tests, the benchmarks, the notebooks' code
cells, and every script the notebooks write (a NameError in a branch no CPU run executes is found here first)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.scripts import script_cells
from course_lib.scripts import LESSON_GLOB

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "pyproject.toml"
# Student notebooks' scripts are stubs: a solution region became `raise NotImplementedError`, so the names it
# defined are undefined, and the imports and loop variables it used are unused. Every other rule holds for them.
STUB_RULES = ["B007", "F401", "F821", "F841"]


def _ruff() -> list[str]:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("ruff is not installed next to this Python: `pip install -e .[test]` (pyproject pins it)")
    return [found]


def _lint(paths, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", "--config", str(CONFIG),
                           *extra, *map(str, paths)], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _write_scripts(tmp_path: Path, folder: str) -> list[Path]:
    written = []
    for notebook in sorted((ROOT / folder).glob(LESSON_GLOB)):
        for target, _, text in script_cells(notebook):
            path = tmp_path / folder / notebook.stem / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    return written


def test_the_code_and_the_notebooks_cells_are_clean():
    done = _lint([ROOT / "course_lib", ROOT / "tests", ROOT / "benchmarks", ROOT / "notebooks", ROOT / "solutions",
                  ROOT / "exercises"])
    assert done.returncode == 0, f"ruff findings (fix them; `ruff check --fix` fixes some):\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("folder", ["notebooks", "solutions"])
def test_every_script_the_notebooks_write_is_clean(folder, tmp_path):
    scripts = _write_scripts(tmp_path, folder)
    assert len(scripts) >= 10, f"only {len(scripts)} scripts found in {folder}/"
    done = _lint(scripts)
    shown = done.stdout.replace(str(tmp_path / folder) + "/", "")
    assert done.returncode == 0, (f"ruff findings in scripts written by {folder}/ (NOTEBOOK/runs/...: fix the "
                                  f"%%write_script cell; in a derived script, drop an unused base line inside an "
                                  f"empty region):\n{shown}{done.stderr}")


def test_the_student_scripts_are_clean_but_for_their_unwritten_answers(tmp_path):
    done = _lint(_write_scripts(tmp_path, "exercises"), "--extend-ignore", ",".join(STUB_RULES))
    assert done.returncode == 0, f"ruff findings in scripts written by exercises/:\n{done.stdout}{done.stderr}"


def test_the_lint_finds_an_undefined_name_in_a_cuda_branch(tmp_path):
    """The bug this file exists for: a name used only where CUDA is present, in a script that imports no `dist`."""
    script = tmp_path / "cuda_branch.py"
    script.write_text("import torch\n\n\ndef setup():\n    if torch.cuda.is_available():\n"
                      "        return dist.is_nccl_available()\n    return False\n")
    done = _lint([script])
    assert done.returncode == 1 and "F821 Undefined name `dist`" in done.stdout, done.stdout
