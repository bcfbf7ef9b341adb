"""The layers point down: ``common/`` (the library) imports nothing from ``local/`` (command-line tools)
or ``recipes/``, and no recipe imports ``local/``. Read from the source with ``ast``, so an import inside
a function counts too."""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORBIDDEN = {"common": ("local", "recipes"), "recipes": ("local",)}


def imported_modules(path):
    """Every module name ``path`` imports (``import a.b``, ``from a.b import c``, ``from a import b``)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def python_files(folder):
    for root, _, files in os.walk(os.path.join(REPO, folder)):
        yield from (os.path.join(root, name) for name in sorted(files) if name.endswith(".py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_module_imports_a_layer_above_it(layer):
    """Each module of ``layer`` imports none of the packages FORBIDDEN to it (a moved import fails here)."""
    wrong = [f"{os.path.relpath(path, REPO)} imports {module}"
             for path in python_files(layer) for module in imported_modules(path)
             if module.split(".")[0] in FORBIDDEN[layer]]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_upward_import(tmp_path):
    """A module that imports local/ is seen, in any of the three import forms."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from local import make_shards\nimport local.check_shards\n")
    assert {"local", "local.make_shards", "local.check_shards"} <= set(imported_modules(str(source)))
