"""Write a training script from a notebook cell, as a plain file that runs from a shell.

Defined for lesson 00: ``%%write_script PATH`` (after ``%load_ext course_lib``) or ``write_script(PATH, text)``.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_script(path: str | os.PathLike, text: str, quiet: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically (parent folders created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not text.endswith("\n"):
        text += "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not quiet:
        lines = text.count("\n")
        print(f"Wrote {path} ({lines} lines). Run it from a shell in {Path.cwd()} with:\n  {launch_hint(path, text)}")
    return path


def launch_hint(path: Path, text: str) -> str:
    """The command the script's docstring gives (its author knows best), else a plain torchrun line."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("torchrun ", "accelerate launch", "ACCELERATE_USE_CPU=", "python ")):
            return stripped
    return f"torchrun --standalone --nproc-per-node 2 {path}"


def write_script_magic(line: str, cell: str) -> None:
    """``%%write_script PATH``: write the cell to PATH (the cell itself is not executed)."""
    target = line.strip()
    if not target:
        raise ValueError("Usage: %%write_script PATH, e.g. %%write_script runs/00_setup/hello.py")
    write_script(target, cell)


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(write_script_magic, magic_kind="cell", magic_name="write_script")
