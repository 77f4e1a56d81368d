"""Every cross-reference in the package's docstrings (``:mod:``, ``:class:``, ``:func:``, ``:meth:``, ``:data:``,
``:attr:``) names something that exists, so a docstring cannot keep pointing at code that moved.

Read statically: the modules are parsed, never imported (no framework loads, and the whole check takes about a
second). A relative reference is resolved from the module it is in as Python resolves a relative import
(``:mod:`..core.loop``` in ``tpu_pretrain/jax_backend/trainer.py`` is ``tpu_pretrain.core.loop``); a bare name from
the class it is in, then its module; a name a module imports is followed to where it is defined.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tpu_pretrain"
ROLE = re.compile(r":(mod|class|func|meth|data|attr):`([^`]+)`")
SCOPES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
BLOCKS = (ast.If, ast.Try, ast.With, ast.For, ast.While)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def package_of(module: str) -> str:
    """The package a relative import in ``module`` starts from: itself for an ``__init__``, else its parent."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def up(package: str, dots: int) -> str:
    """The package ``dots`` leading dots name, from ``package`` (one dot: ``package`` itself)."""
    return ".".join(package.split(".")[: len(package.split(".")) - dots + 1])


@functools.cache
def tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text())


def names_in(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a block of statements binds (definitions, assignments, imports), into if/try/with blocks."""
    found: dict[str, ast.AST] = {}
    for statement in body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[statement.name] = statement
        elif isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            found.update({n.id: statement for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)})
        elif isinstance(statement, ast.Import | ast.ImportFrom):
            found.update({(a.asname or a.name).split(".")[0]: statement for a in statement.names})
        elif isinstance(statement, BLOCKS):
            for block in (statement.body, getattr(statement, "orelse", []), getattr(statement, "finalbody", []),
                          *[h.body for h in getattr(statement, "handlers", [])]):
                found.update(names_in(block))
    return found


def members(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """A class's own names, and the attributes its methods set on ``self``."""
    found = names_in(cls.body)
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and isinstance(node.ctx, ast.Store):
            found.setdefault(node.attr, node)
    return found


def resolves(module: str, parts: list[str]) -> bool:
    """Whether ``module``'s attribute path ``parts`` names something: a submodule, or a name bound there."""
    if not parts:
        return True
    if f"{module}.{parts[0]}" in MODULES:
        return resolves(f"{module}.{parts[0]}", parts[1:])
    node = names_in(tree(module).body).get(parts[0])
    return node is not None and resolves_in(node, module, parts[0], parts[1:])


def resolves_in(node: ast.AST, module: str, name: str, rest: list[str]) -> bool:
    """Whether ``rest`` names something inside ``name``, bound in ``module`` by ``node``."""
    if isinstance(node, ast.ImportFrom):
        source = up(package_of(module), node.level) + (f".{node.module}" if node.module else "") if node.level \
            else node.module or ""
        if source.split(".")[0] != PACKAGE.name:
            return True  # another distribution's name: not this check's business
        original = next(a.name for a in node.names if (a.asname or a.name) == name)
        return resolves(source, [original, *rest])
    if isinstance(node, ast.Import):
        return True
    if not rest:
        return True
    if isinstance(node, ast.ClassDef):
        own = members(node)
        if rest[0] in own:
            return resolves_in(own[rest[0]], module, rest[0], rest[1:])
        bases = names_in(tree(module).body)
        return any(resolves_in(bases[b.id], module, b.id, rest) for b in node.bases
                   if isinstance(b, ast.Name) and b.id in bases)
    return False


def target(text: str) -> str:
    """The name a role's text points at: ``~a.b``, ``title <a.b>`` and ``a.b()`` all point at ``a.b``."""
    if "<" in text:
        text = text[text.index("<") + 1: text.rindex(">")]
    return text.strip().lstrip("~").removesuffix("()")


def reference_resolves(module: str, classes: list[ast.ClassDef], text: str) -> bool:
    name = target(text)
    dots = len(name) - len(name.lstrip("."))
    parts = [p for p in name[dots:].split(".") if p]
    if dots:
        return up(package_of(module), dots) in MODULES and resolves(up(package_of(module), dots), parts)
    if parts[0] == PACKAGE.name:
        return resolves(PACKAGE.name, parts[1:])
    for cls in reversed(classes):  # a bare name: the class the docstring is in, then the module
        own = members(cls)
        if parts[0] in own and resolves_in(own[parts[0]], module, parts[0], parts[1:]):
            return True
    return resolves(module, parts)


def docstring_references(module: str) -> list[tuple[int, list[ast.ClassDef], str, str]]:
    """(line, enclosing classes, role, text) of every role in the docstrings of ``module``."""
    found = []

    def visit(node: ast.AST, classes: list[ast.ClassDef]) -> None:
        inner = classes + [node] if isinstance(node, ast.ClassDef) else classes  # a class's docstring is in it
        if isinstance(node, SCOPES):
            docstring = ast.get_docstring(node, clean=False)
            line = node.body[0].lineno if node.body else 1
            found.extend((line, inner, m.group(1), m.group(2)) for m in ROLE.finditer(docstring or ""))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree(module), [])
    return found


def test_every_docstring_reference_resolves():
    broken = [f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: :{role}:`{text}`"
              for module in MODULES for line, classes, role, text in docstring_references(module)
              if not reference_resolves(module, classes, text)]
    assert not broken, "docstring references to nothing:\n" + "\n".join(broken)


def test_the_check_resolves_as_python_does():
    """Relative to the module, bare names in it, imported names followed, missing names caught."""
    assert reference_resolves("tpu_pretrain.jax_backend.trainer", [], "..core.loop")
    assert reference_resolves("tpu_pretrain.jax_backend", [], ".trainer.JaxTrainer")
    assert reference_resolves("tpu_pretrain.jax_backend", [], "..core.protocol.Trainer")
    assert reference_resolves("tpu_pretrain.core.loop", [], "run_training")
    assert reference_resolves("tpu_pretrain.core.loop", [], "Trainer")  # imported from .protocol
    assert reference_resolves("tpu_pretrain.core.mirror", [], "CheckpointMirror.check_before_save")
    assert not reference_resolves("tpu_pretrain.core.mirror", [], "CheckpointMirror.problem")
    assert not reference_resolves("tpu_pretrain", [], ".train.model")
    assert not reference_resolves("tpu_pretrain.core.loop", [], ".trainer.Trainer")
