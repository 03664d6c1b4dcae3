"""The project's own promises: one set of pinned packages, the fixed layout, CI calling README's command."""
import re
import subprocess
import sys
import tomllib

import yaml

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


def test_top_level_layout():
    for name in ("notebooks", "course_lib", "exercises", "solutions", "tests"):
        assert (ROOT / name).is_dir(), name
    for name in ("environment.yml", "README.md", "pyproject.toml", ".ci/run", ".gitignore"):
        assert (ROOT / name).is_file(), name


def test_run_outputs_and_virtual_environments_are_ignored():
    ignored = (ROOT / ".gitignore").read_text().split()
    for entry in ("runs/", "data/", "checkpoints/", ".venv/"):
        assert entry in ignored


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m course_lib test" in readme and "python3 -m course_lib lab" in readme
    assert "python3 -m course_lib test" in ci and "COURSE_MNIST_MIRROR" in ci


def test_doctor_runs_from_a_fresh_interpreter():
    out = subprocess.run([sys.executable, "-c", "import course_lib; course_lib.doctor()"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "default backend" in out and "torch" in out


def test_importing_course_lib_starts_nothing_heavy():
    code = "import sys, course_lib; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
