"""The package's shape, checked on its own source: one namespace, no import cycle, layers that only
import downwards, and an API process and a network that stay free of what they must not load."""
from __future__ import annotations

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nmt_serve"

# who may import whom: a layer imports only the layers after it (and itself); the engine's wire
# protocol and the input processor are the two modules the API process shares with the engine
LAYERS = ["cli", "service", "training", "convert", "engine", "inference", "text", "network"]
SHARED_DOWNWARDS = {"nmt_serve.cli.common"}  # argument and error helpers every command-line entry point uses


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """{module: the nmt_serve modules it imports anywhere in its file (lazy imports count too)}."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and modules[target].name != "__init__.py":
                    found.add(target)
        graph[name] = found
    return graph


def test_one_namespace_is_installed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["nmt_serve*"]
    assert all(entry.split(":")[0].startswith("nmt_serve.") for entry in project["project"]["scripts"].values())
    stray = [p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name not in ("nmt_serve", "bench")]
    assert not stray, f"packages outside the namespace: {stray}"


def test_no_import_cycle():
    graph = imports()
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_layers_import_only_downwards():
    wrong = []
    for module, targets in imports().items():
        layer = module.split(".")[1] if module.count(".") else None
        if layer not in LAYERS:
            continue
        for target in targets:
            other = target.split(".")[1]
            if target in SHARED_DOWNWARDS or other not in LAYERS:
                continue
            if LAYERS.index(other) < LAYERS.index(layer):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the layers " + " > ".join(LAYERS) + ":\n" + "\n".join(sorted(wrong))


def test_the_network_inference_and_engine_never_import_the_web_stack():
    web = ("fastapi", "pydantic", "pydantic_settings", "prometheus_client", "starlette", "uvicorn")
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        if module.split(".")[1:2] not in (["network"], ["inference"], ["engine"], ["text"]):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            wrong += [f"{module}: {n}" for n in names if n.split(".")[0] in web]
    assert not wrong, wrong
