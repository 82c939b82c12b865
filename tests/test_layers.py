"""The package's layering: modules import downward only and no import forms a circle; no class grows past
~300 lines.

Every ``import dyntc...`` counts, also those inside functions (a lazy import is still a dependency).
A new module must be given its layer here.
"""

import ast
from pathlib import Path

import dyntc

ROOT = Path(dyntc.__file__).parent

# Lower number = lower layer. A module may import its own layer or below, never above.
LAYERS = {
    "dyntc": 0,  # the package's lazy __getattr__ is the public facade (not checked)
    "dyntc._version": 0,
    "dyntc.errors": 0,
    "dyntc.core.files": 1,
    "dyntc.core.machine": 1,
    "dyntc.core._compiled": 1,
    "dyntc.core": 1,
    "dyntc.core.geometry": 2,
    "dyntc.core.text": 2,
    "dyntc.core.episodes": 2,
    "dyntc.core.encoders": 3,
    "dyntc.core.models": 4,
    "dyntc.core.stopping": 4,
    "dyntc.core.inference": 5,
    "dyntc.core.training": 5,
    "dyntc.classifier": 6,
    "dyntc.protocol": 6,
    "dyntc.cli": 7,
    "dyntc.__main__": 7,
}

# The two wings over the core: neither imports the other (what both need belongs in the core).
WINGS = ("dyntc.classifier", "dyntc.protocol")


def module_name(path: Path) -> str:
    parts = ["dyntc", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(name: str) -> int:
    best = max((prefix for prefix in LAYERS if name == prefix or name.startswith(prefix + ".")), key=len, default=None)
    assert best is not None, f"module {name} has no layer: add it to LAYERS in tests/test_layers.py"
    return LAYERS[best]


def imports(path: Path) -> set[str]:
    """The dyntc modules `path` imports anywhere in its body (resolved to module names)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "dyntc")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "dyntc":
                continue
            for alias in node.names:  # `from dyntc.x import y`: y may be a module or a name in x
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _is_module(candidate) else base)
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.split(".")[0] == "dyntc"):  # importlib.import_module("dyntc.x")
            found.add(node.args[0].value)
    return found - {me}


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in ROOT.rglob("*.py")}


def test_every_import_goes_down_or_sideways():
    upward = [(m, dep) for m, deps in graph().items() if m != "dyntc" for dep in deps if layer(dep) > layer(m)]
    assert not upward, "upward imports (module -> higher layer): " + ", ".join(f"{a} -> {b}" for a, b in upward)


def wing(name: str) -> str | None:
    return next((w for w in WINGS if name == w or name.startswith(w + ".")), None)


def test_the_wings_never_import_each_other():
    sideways = [(m, dep) for m, deps in graph().items() for dep in deps
                if wing(m) and wing(dep) and wing(m) != wing(dep)]
    assert not sideways, "a wing imports the other: " + ", ".join(f"{a} -> {b}" for a, b in sideways)


def test_the_core_imports_no_wing():
    up = [(m, dep) for m, deps in graph().items() if m.startswith("dyntc.core") for dep in deps if wing(dep)]
    assert not up, "the core imports a wing: " + ", ".join(f"{a} -> {b}" for a, b in up)


def test_the_checker_sees_a_sideways_import(tmp_path, monkeypatch):
    fake = tmp_path / "dyntc" / "protocol"
    fake.mkdir(parents=True)
    (fake / "single.py").write_text("def f():\n    from dyntc.classifier import DynamicClassifier\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path / "dyntc")
    found = imports(fake / "single.py")
    assert found == {"dyntc.classifier"} and wing("dyntc.protocol.single") != wing("dyntc.classifier")


def test_no_import_cycles():
    edges = {m: {d for d in deps if d != "dyntc"} for m, deps in graph().items() if m != "dyntc"}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles = []

    def visit(node, path):
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_import_module_by_name(tmp_path, monkeypatch):
    fake = tmp_path / "dyntc" / "core" / "geometry"
    fake.mkdir(parents=True)
    (fake / "a.py").write_text("import importlib\ndef f():\n    return importlib.import_module('dyntc.core.geometry.b')\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path / "dyntc")
    assert imports(fake / "a.py") == {"dyntc.core.geometry.b"}


def test_the_checker_sees_a_lazy_upward_import(tmp_path, monkeypatch):
    """The test above would catch the old circle encoders/base -> training -> encoders/base."""
    fake = tmp_path / "dyntc" / "core" / "encoders"
    fake.mkdir(parents=True)
    (fake / "base.py").write_text("def f():\n    from dyntc.core.training import embed\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path / "dyntc")
    assert imports(fake / "base.py") == {"dyntc.core.training"}
    assert layer("dyntc.core.training") > layer("dyntc.core.encoders.base")


MAX_CLASS_LINES = 310  # no class over ~300 lines of code: split a class that grows past it
# ... except the user-facing estimator: its size is its public API (~45 methods, most a few lines
# over its parts, which do not know it); cut into single-use mixins it was one class in five files
LONGER_CLASSES = {"dyntc.classifier.estimator.DynamicClassifier": 450}


def code_lines(node: ast.ClassDef, source: list[str]) -> int:
    """Lines of `node` that hold code: docstrings, comments and blank lines do not count (a class
    is not too long because it explains itself)."""
    docstrings = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (isinstance(inner, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for n in range(node.lineno, node.end_lineno + 1)
               if n not in docstrings and source[n - 1].strip() and not source[n - 1].strip().startswith("#"))


def test_code_lines_ignore_docstrings_and_comments():
    source = 'class A:\n    """Doc\n\n    more doc."""\n\n    # why\n    def f(self):\n        """Doc."""\n        return 1\n'
    node = ast.parse(source).body[0]
    assert code_lines(node, source.splitlines()) == 3  # class A:, def f, return 1


def test_no_class_is_too_long():
    long = []
    for path in ROOT.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef):
                continue
            name = f"{module_name(path)}.{node.name}"
            if (n := code_lines(node, text.splitlines())) > LONGER_CLASSES.get(name, MAX_CLASS_LINES):
                long.append(f"{name}: {n} lines of code")
    assert not long, f"classes over {MAX_CLASS_LINES} lines of code (split them): {long}"
