"""Command line of the workbook; run from the repository root with any Python 3.10+.

  python3 -m course_lib lab            set up .venv (first time), prepare MNIST, open JupyterLab on notebooks/
  python3 -m course_lib test [ARGS]    set up .venv (first time), prepare MNIST, run the test suite (pytest ARGS;
                                       two passes, see course_lib/testpasses.py)
  python3 -m course_lib setup          only set up .venv and prepare MNIST
  python3 -m course_lib doctor         what this machine offers for distributed training
  python3 -m course_lib prepare-data   make data/MNIST/raw hold the verified MNIST files
  python3 -m course_lib exercises build [--check]
                                       generate exercises/ from solutions/ (--check: fail if out of date)
  python3 -m course_lib grade SUBMISSIONS... --out grades.csv
                                       execute and grade submitted exercise notebooks (instructors)
  python3 -m course_lib sizes [NOTEBOOK...]
                                       per lesson: prose words, visible code lines and asserts, repeated base
  python3 -m course_lib book [--only 00,02] [--reuse DIR]
                                       execute the lessons and build the HTML book in build/book/html

``--no-venv`` (before the command) uses the current Python environment (e.g. an activated conda
environment made from environment.yml) instead of ``.venv``.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".course_lib-installed"


def _venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _wanted() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def ensure_venv() -> Path:
    """Create ``.venv`` and install the project into it, unless that was done for this pyproject."""
    python = _venv_python()
    if not python.exists():
        print(f"Creating the virtual environment {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if not STAMP.exists() or STAMP.read_text() != _wanted():
        print("Installing the workbook's packages into .venv (first time: a few minutes) ...", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
        # pip compiles the bytecode of every installed module on one core; compileall does the same on all of them
        # (on a 2-core machine about 92 s of the 182 s install, 56 s this way). It cannot be left to the first import:
        # where PYTHONDONTWRITEBYTECODE is set (common in containers) nothing would ever be written, and every start
        # of a process would compile torch's modules again. Files that are not Python 3 are skipped, as pip does.
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", "-e", f"{ROOT}[test]"],
                       check=True)
        subprocess.run([str(python), "-c", "import compileall, sysconfig; "
                        "compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        STAMP.write_text(_wanted())
    return python


def _in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def main(argv: list[str]) -> int:
    from .errors import USER_ERRORS  # torch-free, so this works before anything is installed

    try:
        return _main(argv)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)  # these messages already say what to do
        return 1


def _main(argv: list[str]) -> int:
    use_current = "--no-venv" in argv
    argv = [a for a in argv if a != "--no-venv"]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("lab", "test", "setup", "book") and not use_current and not _in_venv():
        python = ensure_venv()
        return subprocess.call([str(python), "-m", "course_lib", command, *rest], cwd=ROOT)

    if command == "prepare-data":
        from .data import prepare_mnist

        prepare_mnist()
        return 0
    if command == "doctor":
        from .devices import doctor

        doctor()
        return 0
    if command in ("setup", "lab", "test"):
        from .data import prepare_mnist

        prepare_mnist()
        if command == "lab":
            return subprocess.call([sys.executable, "-m", "jupyter", "lab", str(ROOT / "notebooks"), *_root_flag(), *rest])
        if command == "test":
            from .testpasses import combine, default_workers, pass_environment, passes

            codes = []
            for args in passes(rest, default_workers()):  # see course_lib/testpasses.py
                codes.append(subprocess.call([sys.executable, "-m", "pytest", str(ROOT / "tests"), *args], cwd=ROOT,
                                             env=pass_environment(args, dict(os.environ))))
            code = combine(codes)
            if code == 5:
                print("pytest collected no tests: that is a failure, not a pass.", file=sys.stderr)
                return 1
            return code
        return 0
    if command not in MODULE_COMMANDS:
        print(f"Unknown command {command!r}.\n{__doc__}", file=sys.stderr)
        return 2
    # Imported only when asked for; a module that fails to import raises its own ImportError.
    module = importlib.import_module(f".{MODULE_COMMANDS[command]}", __package__)
    return module.cli(rest)


def _root_flag() -> list[str]:
    """Jupyter refuses to start as root (a container, a cloud VM) without --allow-root: say so, and pass it."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        print("Running as root (as in many containers): starting JupyterLab with --allow-root. On a shared machine "
              "run it as an ordinary user instead.", flush=True)
        return ["--allow-root"]
    return []


#: Commands whose code lives in a module of their own (instructors' tools), by the module's name.
MODULE_COMMANDS = {"exercises": "teaching.exercises", "grade": "teaching.grading", "book": "teaching.book",
                   "sizes": "teaching.sizes"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
