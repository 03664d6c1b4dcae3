"""course_lib's layers, read from its import statements: the core (the top-level modules) never reaches into the
lesson tools (``cluster``) or the instructors' machinery (``teaching``), and no module imports a private name of
another (what a module keeps private can change without breaking the others)."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "course_lib"
MODULES = sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = PACKAGE) -> list[tuple[str, list[str], int]]:
    """(absolute module, imported names, line) for every import in the file, lazy ones inside functions too."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
    return found


def test_the_parser_resolves_relative_and_lazy_imports(tmp_path):
    """The judges below are only as good as this reading of a file's imports."""
    probe = tmp_path / "course_lib" / "cluster" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("import os\nfrom ..launch import torchrun\n\ndef f():\n    from .ranks import _private\n")
    found = imports(probe, root=tmp_path / "course_lib")
    assert found == [("os", [], 1), ("course_lib.launch", ["torchrun"], 2), ("course_lib.cluster.ranks", ["_private"], 5)]


@pytest.mark.parametrize("path", [p for p in MODULES if p.parent == PACKAGE], ids=lambda p: p.name)
def test_a_core_module_does_not_import_the_lesson_tools_or_the_teaching_layer(path):
    for target, _, line in imports(path):
        assert not target.startswith(("course_lib.cluster", "course_lib.teaching")), (
            f"{path.name}:{line} imports {target}: the core must read without the layers built on it")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_private_name_of_another(path):
    for target, names, line in imports(path):
        if not target.startswith("course_lib"):
            continue
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{path.relative_to(PACKAGE)}:{line} imports {private} from {target}"
