"""Every public function and method carries a Google-style docstring (the API reference, `make docs`,
renders it): an `Args:` section when it takes arguments, `Returns:` (or `Yields:`) when it returns a
value and `Raises:` when its body raises. Read from the source (AST), so that nothing is imported.

Exempt, by rule rather than by list: names starting with `_`, properties (documented as attributes),
`@overload` signatures (the implementation's docstring covers them),
`main`-style CLI entry points with no arguments, and a method that overrides a method of a base class in
the package without a docstring of its own (it inherits the base's, as pdoc shows it)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("accounting", "mechanisms", "decoding", "audit", "reports", "dpledger")


def source_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).glob("*.py")
                  if not path.name.startswith("_") or path.name == "__init__.py")


def own_raises(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function's own body (not a nested function or class) holds a `raise` that escapes it:
    a bare re-raise inside an `except` that re-raises what it caught counts, as it passes the error on."""
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def returns_value(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    annotation = function.returns
    if annotation is not None:
        text = ast.unparse(annotation)
        return text not in ("None", "NoReturn", "typing.NoReturn", "Never")
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def is_overload(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """An `@overload` signature: the API reference shows the implementation's docstring for it."""
    return any(ast.unparse(decorator) in ("overload", "typing.overload") for decorator in function.decorator_list)


def is_property(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    names = {ast.unparse(decorator) for decorator in function.decorator_list}
    return bool(names & {"property", "functools.cached_property", "cached_property"}) or any(
        name.endswith((".setter", ".getter")) for name in names)


def arguments(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    args = function.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    if args.vararg:
        names.append(args.vararg.arg)
    if args.kwarg:
        names.append(args.kwarg.arg)
    if method and names and names[0] in ("self", "cls"):
        names = names[1:]
    return names


def class_tables(tree: ast.Module) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    methods, bases = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods[node.name] = {item.name for item in node.body
                                  if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
            bases[node.name] = [ast.unparse(base).split(".")[-1].split("[")[0] for base in node.bases]
    return methods, bases


def package_classes() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """Every class of the package by name: its methods and its bases' names."""
    methods: dict[str, set[str]] = {}
    bases: dict[str, list[str]] = {}
    for path in source_files():
        file_methods, file_bases = class_tables(ast.parse(path.read_text()))
        for name in file_methods:
            methods.setdefault(name, set()).update(file_methods[name])
            bases.setdefault(name, []).extend(file_bases[name])
    return methods, bases


def inherits_doc(owner: str, name: str, classes: tuple[dict[str, set[str]], dict[str, list[str]]]) -> bool:
    """Whether an ancestor class in the package defines the method (pdoc then shows the ancestor's docstring)."""
    methods, bases = classes
    seen, pending = set(), list(bases.get(owner, []))
    while pending:
        base = pending.pop()
        if base in seen:
            continue
        seen.add(base)
        if name in methods.get(base, set()):
            return True
        pending.extend(bases.get(base, []))
    return False


def missing_sections(path: Path, classes: tuple[dict[str, set[str]], dict[str, list[str]]]) -> list[str]:
    tree = ast.parse(path.read_text())
    problems = []
    module = f"{path.parent.name}/{path.name}"

    def check(function: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | None) -> None:
        if function.name.startswith("_") or is_property(function) or is_overload(function):
            return
        doc = ast.get_docstring(function)
        where = f"{module}:{function.lineno} {owner.name + '.' if owner else ''}{function.name}"
        if doc is None:
            if owner is not None and inherits_doc(owner.name, function.name, classes):
                return
            problems.append(f"{where}: no docstring")
            return
        wanted = []
        if arguments(function, owner is not None):
            wanted.append("Args:")
        if returns_value(function) and "Yields:" not in doc:
            wanted.append("Returns:")
        if own_raises(function):
            wanted.append("Raises:")
        absent = [section for section in wanted if section not in doc]
        if absent:
            problems.append(f"{where}: lacks {' '.join(absent)}")

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            check(node, None)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    check(item, node)
    return problems


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_function_has_google_style_sections(package):
    classes = package_classes()
    problems = [problem for path in source_files() if path.parent.name == package
                for problem in missing_sections(path, classes)]
    assert problems == [], f"{len(problems)} public functions lack docstring sections:\n" + "\n".join(problems)


def test_the_checker_finds_what_it_should(tmp_path):
    """The rules on made-up functions: it must flag a missing Args, Returns and Raises, and accept a
    complete docstring, a property and a private helper."""
    code = '''
def undocumented(x): return x
def no_args(x) -> int:
    """Text.

    Returns:
        A number.
    """
def complete(x) -> int:
    """Text.

    Args:
        x: a number.

    Returns:
        x.

    Raises:
        ValueError: never.
    """
    if x is None:
        raise ValueError("x")
    return x
def _private(x): return x
@overload
def typed(x: int) -> int: ...
class Thing:
    @property
    def size(self) -> int: return 1
    def act(self) -> None:
        """Does nothing, takes nothing."""
'''
    path = tmp_path / "case.py"
    path.write_text(code)
    problems = missing_sections(path, ({}, {}))
    assert [p.split(" ", 1)[1] for p in problems] == ["undocumented: no docstring", "no_args: lacks Args:"]
