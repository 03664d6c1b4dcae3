"""Writing a script from a cell: the file, its folders, atomicity, and the cell magic."""
import subprocess
import sys

import pytest

from pathlib import Path

import course_lib
from course_lib.display import shown_path
from course_lib.scripts import write_script, write_script_magic


def test_writes_file_and_creates_folders(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_script(tmp_path / "runs" / "lesson" / "hello.py", "print('hi')")
    assert path.read_text() == "print('hi')\n"
    out = capsys.readouterr().out
    assert (f"Wrote runs/lesson/hello.py (1 lines). Run it from a shell in this folder ({tmp_path.name}/) with:" in out
            and "torchrun" in out)


def test_printed_paths_name_no_folder_of_the_machine(tmp_path, monkeypatch):
    """Saved outputs travel (the book, a learner's notebook): relative to the working folder, the course or home."""
    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "runs" / "a.py") == "runs/a.py"
    assert shown_path(tmp_path) == "."
    course = Path(course_lib.__file__).resolve().parent.parent
    assert shown_path(course / "data" / "MNIST") == "<course>/data/MNIST"
    monkeypatch.setenv("HOME", str(tmp_path.parent))
    monkeypatch.chdir(course)
    assert shown_path(tmp_path / "x") == f"~/{tmp_path.name}/x"
    assert shown_path("/etc/hostname") == "/etc/hostname"


def test_written_script_runs_without_notebook_state(tmp_path):
    path = write_script(tmp_path / "s.py", "import course_lib\nprint(course_lib.MyModel.__name__)", quiet=True)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "MyModel"


def test_rewrite_replaces_whole_file_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "s.py"
    write_script(target, "x = 1\n" * 100, quiet=True)
    write_script(target, "y = 2", quiet=True)
    assert target.read_text() == "y = 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["s.py"]


def test_magic_needs_a_path():
    with pytest.raises(ValueError, match="Usage"):
        write_script_magic("   ", "print(1)")


def test_magic_writes_the_cell(tmp_path):
    write_script_magic(f" {tmp_path / 'm.py'} ", "print(2)")
    assert (tmp_path / "m.py").read_text() == "print(2)\n"


def test_load_ext_registers_the_cell_magic():
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "course_lib")
    assert "write_script" in ip.magics_manager.magics["cell"]


def test_base_of_a_derived_script_is_read_from_its_lesson_notebook():
    from course_lib.scripts import script_source

    base = script_source("runs/02_ddp/train.py")
    assert base.startswith('"""') and "def setup():" in base and "DistributedSampler(" in base


def test_magic_with_base_writes_a_derived_script_and_prints_its_diff(tmp_path, capsys):
    from course_lib.scripts import script_source

    base = script_source("runs/02_ddp/train.py")
    derived = base.replace("    torch.manual_seed(args.seed)",
                           "    # >>> seed: print it\n    print(args.seed)\n    # <<< seed\n    torch.manual_seed(args.seed)", 1)
    write_script_magic(f"{tmp_path / 'd.py'} --base runs/02_ddp/train.py", derived)
    assert (tmp_path / "d.py").read_text() == derived
    out = capsys.readouterr().out
    assert "+ 3 lines, - 0 lines" in out and "+    print(args.seed)" in out


def test_magic_refuses_a_derived_script_that_drifts_and_writes_nothing(tmp_path):
    from course_lib.scripts import LineageError, script_source

    drifted = script_source("runs/02_ddp/train.py").replace("default=256", "default=128", 1)
    with pytest.raises(LineageError, match="outside every marked region"):
        write_script_magic(f"{tmp_path / 'd.py'} --base runs/02_ddp/train.py", drifted)
    assert not (tmp_path / "d.py").exists()


def test_magic_base_needs_a_value_and_an_existing_script(tmp_path):
    from course_lib.scripts import LineageError

    with pytest.raises(ValueError, match="--base BASE"):
        write_script_magic(f"{tmp_path / 'd.py'} --base", "x = 1")
    with pytest.raises(LineageError, match="no cell of the course writes"):
        write_script_magic(f"{tmp_path / 'd.py'} --base runs/nowhere/train.py", "x = 1")


def test_written_script_has_ordinary_file_permissions(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        path = write_script(tmp_path / "s.py", "x = 1", quiet=True)
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_module_is_said_to_be_imported_not_run(tmp_path, capsys, monkeypatch):
    """A file that declares __all__ and has no __main__ (lesson 08's checks.py) is imported by the ranks: no command."""
    monkeypatch.chdir(tmp_path)
    write_script(tmp_path / "runs" / "m" / "helpers.py", '__all__ = ["f"]\n\n\ndef f():\n    return 1\n')
    out = capsys.readouterr().out
    assert "a module: code that imports it puts runs/m/ on sys.path, then `import helpers`" in out
    assert "torchrun" not in out


def test_the_diff_of_a_derived_script_is_saved_as_html_and_as_text(monkeypatch):
    """In a notebook the diff is coloured HTML; its text/plain form is the diff itself, not an object's repr."""
    shown = []
    monkeypatch.setattr("course_lib.scripts.in_notebook", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda data, raw=False: shown.append((data, raw)))
    from course_lib.scripts import show_diff

    show_diff("a\nb\n", "a\nB\n", "base.py", "derived.py")
    (data, raw), = shown
    assert raw and "<details open>" in data["text/html"]
    assert data["text/plain"].startswith("derived.py = base.py + 1 lines, - 1 lines") and "+B" in data["text/plain"]
