"""The library and the study (the `cem-study` package in study/) meet in one direction only: nothing in `cem`
imports the study or names its files or study/results, and the study imports only cem's public faces: no private
module (`cem.x._y`) and no private name (`from cem.x import _name`). Read with `ast` from the source, never
imported (the library's tests run without the study installed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository: the study's tests read both packages, the library's never the study
LIBRARY = ROOT / "src" / "cem"
STUDY = ROOT / "study" / "src" / "cem_study"
STUDY_NAMES = ("cem_study", "cem.experiments", "study/results", "experiments.md", "study/")  # what the library never names


def imports(tree: ast.AST) -> list[tuple[str, str | None]]:
    """(module, name) of every absolute import in `tree`: `import a.b` gives ("a.b", None), `from a import b` ("a", "b")."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.module, alias.name) for alias in node.names]
    return found


def private_cem_imports(tree: ast.AST) -> list[str]:
    """The imports in `tree` of a private cem module or name: a dotted part or an imported name starting with `_`."""
    private = lambda part: part.startswith("_") and not (part.startswith("__") and part.endswith("__"))  # noqa: E731
    return [f"{module}{'' if name is None else ' import ' + name}" for module, name in imports(tree)
            if module.split(".")[0] == "cem" and (any(map(private, module.split("."))) or (name is not None and private(name)))]


def study_imports(tree: ast.AST) -> list[str]:
    """The imports in `tree` of the study (`cem_study`, or its old home `cem.experiments`)."""
    return [module for module, name in imports(tree)
            if module.split(".")[0] == "cem_study" or module.startswith("cem.experiments") or (module == "cem" and name == "experiments")]


def sources(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def test_the_checks_see_what_they_look_for():
    tree = ast.parse("import cem.kernels._triton_kernels\nfrom cem.cli import _run, main\nfrom cem.layers import CEMMLP\n"
                     "from .x import _y\nimport cem_study.report\nfrom cem import experiments\ndef f():\n    from cem_study import plan\n")
    assert private_cem_imports(tree) == ["cem.kernels._triton_kernels", "cem.cli import _run"]
    assert study_imports(tree) == ["cem_study.report", "cem", "cem_study"]
    assert private_cem_imports(ast.parse("from cem.data import __version__")) == []


def test_the_library_imports_and_names_nothing_of_the_study():
    files = [p for p in LIBRARY.rglob("*") if p.is_file() and p.suffix in (".py", ".cpp", ".md", ".txt", ".json")]
    assert len(files) > 50
    imported = {str(p.relative_to(ROOT)): found for p in sources(LIBRARY) if (found := study_imports(ast.parse(p.read_text())))}
    assert not imported, f"the library imports the study: {imported}"
    named = {str(p.relative_to(ROOT)): [n for n in STUDY_NAMES if n in p.read_text()] for p in files}
    assert not {k: v for k, v in named.items() if v}, f"the library names the study: {named}"


def test_the_study_imports_only_cems_public_faces():
    if not STUDY.is_dir():
        pytest.skip("no study/ beside the library (an installed library alone)")
    files = sources(STUDY)
    assert len(files) > 20
    private = {str(p.relative_to(ROOT)): found for p in files if (found := private_cem_imports(ast.parse(p.read_text())))}
    assert not private, f"the study imports private parts of cem: {private}"


def test_the_librarys_links_into_the_study_exist():
    """README.md and docs/*.md link into study/ (the library's own doc tests leave those links to the study)."""
    import re

    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        links = [p for p in re.findall(r"\]\(([^)#]+)\)", doc.read_text()) if "study/" in p]
        assert links or doc.name not in ("README.md", "LOG.md"), doc
        missing = [p for p in links if not (doc.parent / p).exists()]
        assert not missing, f"{doc.name} links to study paths that do not exist: {missing}"
