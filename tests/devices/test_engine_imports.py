"""The engines meet only in what they share: a layer's meaning (vkserve.models) and the neutral
modules of vkserve.devices (errors, arena, reference). The CPU engine imports nothing of the
Vulkan engine and the reverse, and no modules of vkserve.devices and vkserve.models import
each other in a circle (module level and TYPE_CHECKING blocks count; imports inside functions
do not)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vkserve

ROOT = Path(vkserve.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, top_level_only: bool) -> set[str]:
    """Modules (and `from` names, as module.name) that `path` imports; relative ones resolved."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


@pytest.mark.parametrize("package, other", [("vkserve.devices.vulkan", "vkserve.devices.cpu"),
                                            ("vkserve.devices.cpu", "vkserve.devices.vulkan")])
def test_engines_do_not_import_each_other(package: str, other: str) -> None:
    folder = ROOT.parent.joinpath(*package.split("."))
    offending = sorted(
        f"{path.relative_to(ROOT.parent)}: {name}"
        for path in folder.rglob("*.py")
        for name in imported(path, top_level_only=False)
        if name == other or name.startswith(other + ".")
    )
    assert not offending, offending


def test_no_import_circles() -> None:
    modules = {module_name(p): p for part in ("devices", "models")
               for p in (ROOT / part).rglob("*.py")}
    edges = {m: {n for n in imported(p, top_level_only=True) if n in modules and n != m}
             for m, p in modules.items()}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                circles.append(path[path.index(n):] + [n])
            elif n not in state:
                walk(n)
        path.pop()
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            walk(m)
    assert not circles, [" -> ".join(c) for c in circles]
