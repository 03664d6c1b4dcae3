"""The command line: errors a learner can cause print their message (caught by type), a broken module
shows its own ImportError, an unknown command says so, and the errors module needs no torch."""
import subprocess
import sys

import pytest

from course_lib import __main__ as cli
from course_lib import data
from course_lib.errors import DataError, LaunchConfigError


def test_a_data_error_prints_its_message_and_exits_1(monkeypatch, capsys):
    def offline(*args, **kwargs):
        raise DataError("MNIST is not on disk; set COURSE_MNIST_MIRROR")

    monkeypatch.setattr(data, "prepare_mnist", offline)
    assert cli.main(["--no-venv", "prepare-data"]) == 1
    assert capsys.readouterr().err == "error: MNIST is not on disk; set COURSE_MNIST_MIRROR\n"


def test_an_error_subclassing_a_learner_error_is_caught_by_type_not_by_name(monkeypatch, capsys):
    class NoSuchBackend(LaunchConfigError):
        pass

    def doctor():
        raise NoSuchBackend("backend 'nccl' needs CUDA GPUs")

    monkeypatch.setattr("course_lib.devices.doctor", doctor)
    assert cli.main(["--no-venv", "doctor"]) == 1
    assert "backend 'nccl' needs CUDA GPUs" in capsys.readouterr().err


def test_any_other_error_keeps_its_traceback(monkeypatch):
    def broken():
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("course_lib.devices.doctor", broken)
    with pytest.raises(ZeroDivisionError):
        cli.main(["--no-venv", "doctor"])


def test_a_module_that_fails_to_import_raises_its_own_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "course_lib.teaching.grading", None)  # importing it now raises ImportError
    with pytest.raises(ImportError, match="course_lib.teaching.grading"):
        cli.main(["--no-venv", "grade", "nothing.ipynb"])


def test_an_unknown_command_says_so_and_exits_2(capsys):
    assert cli.main(["--no-venv", "train-everything"]) == 2
    assert "Unknown command 'train-everything'" in capsys.readouterr().err


def test_the_errors_module_imports_no_torch():
    code = "import sys, course_lib.errors; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_old_import_locations_of_the_errors_still_work():
    import course_lib
    from course_lib import devices

    assert course_lib.DataError is data.DataError is DataError
    assert course_lib.LaunchConfigError is devices.LaunchConfigError is LaunchConfigError


@pytest.mark.parametrize("uid, flagged", [(0, True), (1000, False)])
def test_lab_passes_allow_root_only_when_running_as_root(monkeypatch, capsys, uid, flagged):
    """Jupyter refuses to run as root without --allow-root ("Running as root is not recommended")."""
    called = []
    monkeypatch.setattr(cli.os, "geteuid", lambda: uid)
    monkeypatch.setattr(data, "prepare_mnist", lambda *a, **k: None)
    monkeypatch.setattr(cli.subprocess, "call", lambda argv, **kwargs: called.append(argv) or 0)
    assert cli.main(["--no-venv", "lab"]) == 0
    assert ("--allow-root" in called[0]) == flagged
    assert ("--allow-root" in capsys.readouterr().out) == flagged
