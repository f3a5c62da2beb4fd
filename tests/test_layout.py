"""The house's layout: imports point down the layers, no module imports itself back, no file grows past ~400 lines.

Read from the source with `ast`, function-local imports included, so a cycle hidden inside
a function (the kind that once joined train/sample.py and train/text.py) fails here too.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "txjax"

# A module may import its own package and those of a lower rank (DESIGN.md's picture).
RANK = {"": 4, "argtypes": 0, "hostmem": 0, "paths": 0, "ops": 0, "config": 1, "nn": 2, "cost": 2, "models": 3, "data": 3,
        "decoding": 4, "beam": 4, "scoring": 4, "hf": 4, "train": 5, "tasks": 6, "bench": 6, "studies": 7}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The txjax modules `path` imports, anywhere in the file: `from txjax.x import y` is txjax.x.y
    when that is a module, else txjax.x."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("txjax")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("txjax"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in modules else node.module)
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports(path, set(files)) if m in files and m != name}
            for name, path in files.items()}


def layer(module: str) -> str:
    """The package a module belongs to; "" for the front door `txjax` (it re-exports models and generate)."""
    return module.split(".")[1] if module.count(".") else ""


def test_imports_point_down_the_layers():
    wrong = []
    for module, targets in graph().items():
        if module == "txjax":  # the package's front door re-exports the models and generate
            continue
        for target in targets:
            if RANK[layer(target)] > RANK[layer(module)]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports that point up:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles_between_files():
    g = graph()
    g.pop("txjax", None)
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1  # on the current path
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2  # done

    for node in sorted(g):
        if node not in state:
            visit(node, [node])


def test_no_file_over_about_400_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 420}
    assert not long, long
