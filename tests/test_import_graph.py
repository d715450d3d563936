"""The package's import graph, read from the source: no cycle (counting imports inside functions),
dependencies flowing one way (accounting <- mechanisms <- decoding <- audit <- reports <- dpledger),
and every import inside a function deferred for a reason this file can check.

A deferred import is allowed when (a) it loads a heavy or optional third-party package (HEAVY, with
its reason), (b) it loads one of the project's modules that imports such a package at its top while
the importing module does not (the deferral keeps the importer light), (c) a command module
(COMMAND_MODULES) loads the work of its subcommand when the subcommand runs, or (d) its line says
why: `# deferred: <reason>`. Anything else belongs at the top of its module, where a reader sees it.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"accounting": "dpledger.accounting", "mechanisms": "dpledger.mechanisms",
            "decoding": "dpledger.decoding", "audit": "dpledger.audit", "reports": "dpledger.reports",
            "dpledger": "dpledger"}
LAYERS = ["dpledger.accounting", "dpledger.mechanisms", "dpledger.decoding", "dpledger.audit", "dpledger.reports",
          "dpledger"]
"""Lowest first: a module may import its own layer and the ones before it only (dpledger.version, a
leaf with the version string, is importable from every layer)."""
HEAVY = {
    "transformers": "Hugging Face models: ~0.8 s to import; only model loading needs it",
    "peft": "LoRA adapters: ~4.7 s to import; only LoRA teachers need it",
    "tokenizers": "only model and tokenizer loading need it",
    "huggingface_hub": "only hub lookups need it",
    "safetensors": "only weight files need it",
    "dp_accounting": "interop with dp-accounting: ~1 s to import; PLD and DpEvent paths only",
    "matplotlib": "plots only: ~0.5 s",
    "pandas": "tables only: ~0.4 s",
    "pyarrow": "parquet only",
    "numba": "the fused CPU kernels: import and JIT compilation on first use",
    "llvmlite": "numba's compiler",
    "distributed": "optional extra [dask]: Dask clusters only",
    "dask": "optional extra [dask]: Dask clusters only",
    "bokeh": "optional extra [dask]: the Dask dashboard only",
    "playwright": "optional: the HTML report's browser test only",
    "peft.tuners": "LoRA adapters",
}

COMMAND_MODULES = frozenset({"dpledger.cli", "dpledger.demo", "dpledger.demo_cli", "dpledger.accounting_demo"} | {
    f"dpledger.{path.stem}" for path in (ROOT / "dpledger").glob("*_cli.py")})
"""The command line: every subcommand's parser is built at start-up, so each loads the packages its work
needs (decoding, audit, reports) only when it runs; `dpledger --help` and `dpledger account` start
without them. The accounting layer, which `import dpledger` loads anyway, is imported at the top."""


@dataclass
class Module:
    name: str
    path: Path
    top: set[str] = field(default_factory=set)             # project modules imported at module level
    top_external: set[str] = field(default_factory=set)    # third-party top-level packages imported at module level
    deferred: list[tuple[int, str, str]] = field(default_factory=list)  # (line, target, source line)


def _modules() -> dict[str, Module]:
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = Module(name, path)
    return modules


def _targets(node: ast.AST, modules: dict[str, Module], here: str) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: resolve against the importing package
            parts = here.split(".")[:-node.level] if not here.endswith("__init__") else here.split(".")
            base = ".".join(parts + ([base] if base else []))
        return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    return [alias.name for alias in node.names]


def _parse(modules: dict[str, Module]) -> None:
    for module in modules.values():
        source = module.path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)

        def visit(node: ast.AST, in_function: bool, module: Module = module, lines: list[str] = lines) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _targets(child, modules, module.name):
                        if in_function:
                            module.deferred.append((child.lineno, target, lines[child.lineno - 1]))
                        elif target in modules or target.startswith("dpledger."):
                            module.top.add(_known(target, modules))
                        else:
                            module.top_external.add(target.split(".")[0])
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, True)
                elif (isinstance(child, ast.If) and not in_function
                      and "TYPE_CHECKING" in ast.unparse(child.test)):
                    continue  # annotations only: never executed
                else:
                    visit(child, in_function)

        visit(tree, False)


def _known(target: str, modules: dict[str, Module]) -> str:
    while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
    return target


GRAPH = _modules()
_parse(GRAPH)


def _layer(name: str) -> int:
    """The index of the layer `name` belongs to: its longest matching prefix (every module matches "dpledger")."""
    return max((i for i, layer in enumerate(LAYERS) if name == layer or name.startswith(layer + ".")),
               key=lambda i: len(LAYERS[i]))


def _is_heavy(name: str, seen: frozenset = frozenset()) -> bool:
    """True when importing project module `name` loads a HEAVY package (at some module's top)."""
    module = GRAPH[name]
    if module.top_external & set(HEAVY):
        return True
    return any(_is_heavy(t, seen | {name}) for t in module.top if t in GRAPH and t not in seen | {name})


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
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
            if len(component) > 1 or v in edges[v]:
                found.append(sorted(component))

    for vertex in sorted(edges):
        if vertex not in index:
            connect(vertex)
    return found


def test_layers_are_read_from_the_longest_prefix():
    assert [_layer(name) for name in ("dpledger.accounting.curve", "dpledger.mechanisms.pmixed", "dpledger.decoding.run",
                                      "dpledger.audit.audit", "dpledger.reports.render", "dpledger.cli",
                                      "dpledger.accounting_demo")] == [0, 1, 2, 3, 4, 5, 5]


def test_the_graph_is_read():
    assert {"dpledger.accounting.curve", "dpledger.mechanisms.pmixed", "dpledger.decoding.run",
            "dpledger.audit.audit", "dpledger.reports.render", "dpledger.cli"} <= set(GRAPH)
    assert "dpledger.accounting.curve" in GRAPH["dpledger.mechanisms.pmixed"].top


def test_no_import_cycle_even_through_imports_inside_functions():
    edges = {name: set(m.top) | {_known(t, GRAPH) for _, t, _ in m.deferred if _known(t, GRAPH) in GRAPH}
             for name, m in GRAPH.items()}
    edges = {name: {t for t in targets if t in GRAPH and t != name} for name, targets in edges.items()}
    assert _cycles(edges) == []


def test_dependencies_flow_one_way():
    upward = []
    for name, module in GRAPH.items():
        targets = set(module.top) | {_known(t, GRAPH) for _, t, _ in module.deferred}
        for target in sorted(t for t in targets if t in GRAPH and t != "dpledger.version"):
            if _layer(target) > _layer(name) and not (name.startswith(target + ".") or target == "dpledger"):
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_every_import_inside_a_function_is_deferred_for_a_reason():
    undeclared = []
    for name, module in GRAPH.items():
        for line, target, text in module.deferred:
            top = target.split(".")[0]
            if "# deferred:" in text or top in HEAVY or target in HEAVY:
                continue
            known = _known(target, GRAPH)
            if known in GRAPH and _is_heavy(known) and not _is_heavy(name):
                continue
            if name in COMMAND_MODULES and known in GRAPH and _layer(known) > 0:
                continue
            undeclared.append(f"{module.path.relative_to(ROOT)}:{line}: {text.strip()}")
    assert undeclared == [], "imports inside functions with no reason (move them to the module's top, or say why " \
                             "with `# deferred: <reason>`):\n" + "\n".join(undeclared)
