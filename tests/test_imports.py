"""The package's imports: no module of samu/ imports a module that imports it back, directly or
through others (an import inside a function counts as one at the top: a lazy import hides a
circle, it does not open it), and every module imports in a fresh interpreter whatever was
imported before it."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from samu import paths

PACKAGE = paths.REPO_ROOT / "samu"


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    """{dotted name: file} of every module of the package at ``root``; a package is its
    __init__.py.  A __main__.py is a script (importing it runs it): left out."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(node, name: str, is_package: bool, known) -> list[str]:
    """The modules of ``known`` that one import statement of module ``name`` loads: a name
    imported from a package is its submodule where there is one, else the package itself."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = name.split(".") if is_package else name.split(".")[:-1]
            anchor = anchor[:len(anchor) - node.level + 1]
            base = ".".join(anchor + ([node.module] if node.module else []))
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                   for alias in node.names]
    found = []
    for target in targets:
        while target and target not in known:  # a name inside a module: that module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.append(target)
    return found


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the modules of ``files`` it imports anywhere in its source}."""
    graph = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        graph[name] = {target for node in ast.walk(ast.parse(path.read_text()))
                       if isinstance(node, (ast.Import, ast.ImportFrom))
                       for target in _imported(node, name, is_package, files)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's import circles: each strongly connected component of two modules or more,
    sorted (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_the_import_graph_of_samu_has_no_cycle():
    graph = import_graph(module_files())
    assert len(graph) > 50 and "samu.functional" in graph["samu.modules"], graph
    assert cycles(graph) == []


def test_a_circle_is_found_through_imports_inside_functions(tmp_path):
    """The check itself: a circle closed by a lazy import, through a package's __init__, a
    relative import of a submodule and one of a name, beside a module outside any circle."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    sources = {"__init__.py": "from .a import thing\n",
               "a.py": "thing = 1\n\ndef f():\n    from .sub import b\n",
               "sub/__init__.py": "",
               "sub/b.py": "from ..c import other\n",
               "c.py": "import os\n\ndef g():\n    from . import a\n    return a\nother = 2\n",
               "d.py": "from .a import thing\n"}
    for name, text in sources.items():
        (package / name).write_text(text)
    graph = import_graph(module_files(package))
    assert graph["pkg.d"] == {"pkg.a"} and graph["pkg"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_every_module_imports_in_a_fresh_interpreter_in_either_order():
    """Every module imported in one interpreter in sorted order and in another in reverse
    order, so that no module relies on another having been imported first (each is first in
    one of them, and last in the other)."""
    names = sorted(module_files())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(paths.REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                  if p]))
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    runs = [subprocess.Popen([sys.executable, "-c", code, *order], cwd=paths.REPO_ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for order in (names, names[::-1])]
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]


def _run_fresh(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(paths.REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                  if p]))
    return subprocess.run([sys.executable, "-c", code], cwd=paths.REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_distributed_and_integrations_are_attributes_imported_on_first_use():
    """README's samu.distributed.build_cp_context and samu.integrations.transformers.patch work
    after a bare ``import samu``, which imports neither them nor transformers."""
    import importlib.util
    has_transformers = importlib.util.find_spec("transformers") is not None
    code = f"""
import sys
import samu
lazy = ("samu.distributed", "samu.integrations", "samu.integrations.transformers",
        "samu.integrations.weights", "transformers")
assert not [m for m in lazy if m in sys.modules], [m for m in lazy if m in sys.modules]
assert {{"distributed", "integrations"}} <= set(dir(samu))
assert callable(samu.distributed.build_cp_context)
assert "transformers" not in sys.modules  # samu.integrations imports none of its submodules
# dir() names a submodule that needs transformers only once imported: help() and inspect read
# every name dir() gives, and must work without transformers
assert "weights" in dir(samu.integrations) and "transformers" not in dir(samu.integrations)
assert samu.integrations.weights is sys.modules["samu.integrations.weights"]
assert "transformers" not in sys.modules
if {has_transformers}:
    assert callable(samu.integrations.transformers.patch)
    assert "transformers" in sys.modules and "transformers" in dir(samu.integrations)
for owner, name in ((samu, "nothing"), (samu.integrations, "nothing")):
    try:
        getattr(owner, name)
    except AttributeError as exc:
        assert "has no attribute 'nothing'" in str(exc), exc
    else:
        raise AssertionError(f"{{owner.__name__}}.nothing resolved")
print("ok")
"""
    out = _run_fresh(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_integrations_package_can_be_inspected_without_transformers():
    code = """
import inspect, pydoc, sys
sys.modules["transformers"] = None  # as if it were not installed: importing it fails
import samu.integrations as integrations
names = dict(inspect.getmembers(integrations))
assert "weights" in names and "transformers" not in names
assert "weights" in pydoc.render_doc(integrations)
try:
    integrations.transformers
except ImportError:
    pass
else:
    raise AssertionError("samu.integrations.transformers imported without transformers")
print("ok")
"""
    out = _run_fresh(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
