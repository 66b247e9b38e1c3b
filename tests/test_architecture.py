"""The package's architecture, read statically from every module's imports (function-level ones too).

The rule: the packages form layers, and a module imports only from its own package and the layers
below it. Within a package, modules import each other without cycles. No module imports another
module's private (underscored) name. A budget is a plain value: it imports nothing of resaware's and
no TVM.
"""

from __future__ import annotations

import ast
from pathlib import Path

import resaware

PACKAGE = Path(resaware.__file__).parent
# Bottom to top. "" is the base: the modules directly under resaware/ other than __init__.
LAYERS = ["", "platform", "runtime", "frontend", "store", "tuning", "deploy", "analysis", "cli"]
TOP = "resaware"  # resaware/__init__.py: the public API, which may name anything


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _package_of(module: str) -> str:
    """The layer a module belongs to: its subpackage's name, "" for a base module, TOP for resaware itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return TOP
    return parts[1] if MODULES[".".join(parts[:2])].name == "__init__.py" else ""


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if MODULES[module].name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported resaware module, name taken from it or None, line) for every import in `module`."""
    tree = ast.parse(MODULES[module].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "resaware"]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if source.split(".")[0] != "resaware":
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:  # `from resaware.pkg import module`
                    found.append((f"{source}.{alias.name}", None, node.lineno))
                else:
                    found.append((source, alias.name, node.lineno))
    return found


def _layer(module: str) -> int:
    package = _package_of(module)
    return len(LAYERS) if package == TOP else LAYERS.index(package)


def test_every_subpackage_is_a_layer():
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(LAYERS) - {""}


def test_imports_go_down_the_layers():
    upward = []
    for module in MODULES:
        for target, _, line in _imports(module):
            if target in MODULES and _layer(target) > _layer(module):
                upward.append(
                    f"{module}:{line} imports {target} ({_package_of(target)} is above {_package_of(module)})"
                )
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    graph = {m: {t for t, _, _ in _imports(m) if t in MODULES and t != m} for m in MODULES}
    graph = {m: {t for t in targets if not _contains(t, m)} for m, targets in graph.items()}
    done, cycles = set(), []

    def visit(module, path):
        if module in path:
            cycles.append(" -> ".join(path[path.index(module) :] + [module]))
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, "\n".join(cycles)


def _contains(package: str, module: str) -> bool:
    """Whether `module` lies inside `package` (a package's __init__ re-exporting its own modules is no cycle)."""
    return MODULES[package].name == "__init__.py" and module.startswith(package + ".")


def test_no_private_name_crosses_a_module():
    private = [
        f"{module}:{line} imports {name} from {target}"
        for module in MODULES
        for target, name, line in _imports(module)
        if name is not None and name.startswith("_") and target != module
    ]
    assert not private, "\n".join(private)


def test_a_budget_is_a_plain_value():
    tree = ast.parse(MODULES["resaware.budget"].read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "." for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.level or n.module)]
    assert not [n for n in names if n.split(".")[0] in ("resaware", "tvm", "tvm_ffi", ".")], names


def test_modules_are_small_enough_to_read():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 420}
    assert not long, long
