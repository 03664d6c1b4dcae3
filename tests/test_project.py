"""The project's own promises: one set of pinned packages, the fixed layout, CI calling README's command."""
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from course_lib.data import MNIST_FILES
from notebook_runner import ROOT


def _pins(requirements):
    pins = {}
    for req in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*==\s*([^\s;]+)", req.strip())
        if match:
            pins[match[1].lower().replace("_", "-")] = match[2]
    return pins


def test_pyproject_and_environment_yml_pin_the_same_packages_and_versions():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    from_pyproject = _pins(project["dependencies"] + project["optional-dependencies"]["test"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    from_conda = _pins([r for r in pip_section if not r.startswith("-")])
    assert from_pyproject == from_conda
    assert from_pyproject["torch"] == "2.14.1" and from_pyproject["torchvision"] == "0.29.1"


def test_every_pinned_package_is_the_installed_version():
    from importlib.metadata import version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for name, pinned in _pins(project["dependencies"]).items():
        assert version(name).split("+")[0] == pinned, f"{name}: installed {version(name)}, pinned {pinned}"


def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_top_level_layout_is_committed():
    tracked = set(_git("ls-files").stdout.splitlines())
    for folder in ("notebooks", "course_lib", "exercises", "solutions", "tests"):
        assert any(path.startswith(f"{folder}/") for path in tracked), f"nothing of {folder}/ is committed"
    for name in ("environment.yml", "README.md", "pyproject.toml", ".ci/run", ".gitignore"):
        assert name in tracked, f"{name} is not committed"


def test_run_outputs_and_virtual_environments_are_ignored_by_git():
    for path in ("notebooks/runs/02_ddp/metrics.jsonl", "runs/x/train.py", "data/MNIST/raw/t10k-labels-idx1-ubyte",
                 "notebooks/data/MNIST/raw/x", "checkpoints/checkpoint-1.pt", ".venv/bin/python"):
        assert _git("check-ignore", "-q", "--no-index", path).returncode == 0, f"git does not ignore {path}"
    for path in ("notebooks/02a_ddp_script.ipynb", "course_lib/launch.py", "benchmarks/bench.py", "exercises/x.ipynb"):
        assert _git("check-ignore", "-q", "--no-index", path).returncode == 1, f"git ignores {path}"


def _readme_commands() -> list[list[str]]:
    """The ``python3 -m course_lib ...`` lines of README's shell blocks, as words (comments dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = [line.split("#")[0].split() for block in blocks for line in block.splitlines()]
    return [words for words in lines if words[:3] == ["python3", "-m", "course_lib"]]


def test_readme_names_only_commands_the_command_line_has():
    from course_lib import __main__ as cli

    commands = {words[3] for words in _readme_commands() if len(words) > 3}
    assert {"lab", "test"} <= commands
    known = set(cli.MODULE_COMMANDS) | {"lab", "test", "setup", "doctor", "prepare-data"}
    assert commands <= known, f"README shows unknown commands: {commands - known}"


def test_ci_runs_the_readme_test_command_with_the_mnist_mirror(tmp_path):
    """.ci/run, with a stand-in python3 on PATH that records how it was called."""
    record = tmp_path / "called"
    fake = tmp_path / "python3"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$COURSE_MNIST_MIRROR" "$@" > {record}\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "COURSE_MNIST_MIRROR"}
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    subprocess.run([str(ROOT / ".ci" / "run")], env=env, check=True, capture_output=True, timeout=60)
    mirror, *called = record.read_text().splitlines()
    readme_test = next(words[1:] for words in _readme_commands() if words[3:] == ["test"])  # the plain one
    assert called[:len(readme_test)] == readme_test, f"CI calls {called}, README says {readme_test}"
    assert all((Path(mirror) / name).is_file() for name in MNIST_FILES), f"CI's mirror {mirror} lacks MNIST"


def test_doctor_runs_from_a_fresh_interpreter():
    out = subprocess.run([sys.executable, "-c", "import course_lib; course_lib.doctor()"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "default backend" in out and "torch" in out


def test_importing_course_lib_starts_nothing_heavy():
    code = "import sys, course_lib; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
