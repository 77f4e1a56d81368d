"""The package's shape: layers that import only downwards, no cycles, no borrowed private names, small
modules and functions, a data package and a run core that never load TensorFlow or JAX, and two sibling
backends that never import each other."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tpu_pretrain"
# Lowest first: a module may import from its own layer (without cycles) or a lower one.
LAYERS = (
    ("errors", "formatting", "runtime", "release", "pinned_sets", "child_process", "environment", "folder_lock",
     "wire_format"),
    ("storage",),
    ("models",),
    ("settings", "config", "config_checks", "backend"),
    ("data",),
    ("core",),
    ("tf_backend", "jax_backend"),
    ("training",),
    ("export",),
    ("cli", "notebook", "demo", "__init__", "__main__"),
)
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(name: str) -> int:
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for index, members in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{name} belongs to no layer: add it to LAYERS")


def imports(name: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import of the package, lazy ones included."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "tpu_pretrain":
                continue
            names = [a.name for a in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in ALL]
            if submodules:
                found += [(sub, [], node.lineno) for sub in submodules]
            else:
                found.append((target, names, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "tpu_pretrain"]
    return found


ALL = modules()


def test_every_module_imports_only_its_own_layer_or_lower():
    wrong = []
    for name, path in ALL.items():
        for target, _, line in imports(name, path):
            if target in ALL and layer(target) > layer(name):
                wrong.append(f"{name}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    graph = {name: {t for t, _, _ in imports(name, path) if t in ALL and t != name} for name, path in ALL.items()}
    # A package's __init__ is run by importing any of its modules: not an edge of its own.
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_no_module_takes_another_modules_private_names():
    borrowed = []
    for name, path in ALL.items():
        for target, names, line in imports(name, path):
            if target != name:
                borrowed += [f"{name}:{line} imports {n} from {target}" for n in names if n.startswith("_")]
    assert not borrowed, "\n".join(borrowed)


def test_modules_and_functions_stay_small():
    too_big = []
    for name, path in ALL.items():
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"module {name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_big.append(f"function {name}.{node.name}: {length} lines")
    assert not too_big, "\n".join(too_big)


FRAMEWORKS = ("tensorflow", "tf_keras", "bert4keras", "jax", "jaxlib", "keras", "flax")


def third_party_imports(path: Path) -> list[tuple[str, int]]:
    """(top-level module, line) of every import of another distribution, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("package", ["data", "core", "models"])
def test_the_data_package_and_the_run_core_import_no_framework(package):
    """Not even lazily: a JAX process must never load TensorFlow through the core, nor a data step either."""
    wrong = [f"{name}:{line} imports {module}" for name, path in ALL.items()
             if name.startswith(f"tpu_pretrain.{package}") for module, line in third_party_imports(path)
             if module in FRAMEWORKS]
    assert not wrong, "\n".join(wrong)


def test_the_tensorflow_backends_set_up_loads_no_tensorflow():
    """The command line and notebook kernels use ``tf_backend.setup`` where TensorFlow must not load: neither it nor
    ``tf_backend/__init__`` imports a framework (not even lazily, nor through ``environment.import_tensorflow``), nor a
    module of the backend outside the set-up; the ``__init__`` imports nothing of the package at all."""
    wrong = []
    for name, path in ALL.items():
        if name == "tpu_pretrain.tf_backend" or name.startswith("tpu_pretrain.tf_backend.setup"):
            wrong += [f"{name}:{line} imports {module}" for module, line in third_party_imports(path)
                      if module in FRAMEWORKS]
            wrong += [f"{name}:{line} imports {t} {names}" for t, names, line in imports(name, path)
                      if name == "tpu_pretrain.tf_backend" or "import_tensorflow" in names
                      or t.startswith("tpu_pretrain.tf_backend") and not t.startswith("tpu_pretrain.tf_backend.setup")]
    assert not wrong, "\n".join(wrong)


def test_the_backends_are_siblings():
    """Dropping a backend is deleting its folder: neither imports the other, and JAX's never imports TensorFlow."""
    wrong = []
    for name, path in ALL.items():
        for backend, other, banned in (("jax_backend", "tf_backend", ("tensorflow", "tf_keras", "bert4keras")),
                                       ("tf_backend", "jax_backend", ("jax", "jaxlib"))):
            if name.startswith(f"tpu_pretrain.{backend}"):
                wrong += [f"{name}:{line} imports {t}" for t, _, line in imports(name, path)
                          if t.startswith(f"tpu_pretrain.{other}")]
                wrong += [f"{name}:{line} imports {m}" for m, line in third_party_imports(path) if m in banned]
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_data_preparation_never_imports_tensorflow(tmp_path):
    """Every module of tpu_pretrain.data, and a whole create-data run, without TensorFlow loaded."""
    data_modules = [name for name in ALL if name.startswith("tpu_pretrain.data")]
    script = textwrap.dedent(f"""
        import importlib, sys
        for name in {data_modules!r}:
            importlib.import_module(name)
        from tpu_pretrain.config import Config
        from tpu_pretrain.data.create import create_pretraining_data
        from tpu_pretrain.data.sample_corpus import write_sample_corpus
        from tpu_pretrain.data.vocab import build_vocab
        corpus = str(write_sample_corpus({str(tmp_path / "corpus.txt")!r}, max_chars=40_000))
        vocab = build_vocab(Config.load(input=[corpus], vocab_size=1200, num_unused_tokens=5,
                                        output_dir={str(tmp_path)!r}))
        manifest = create_pretraining_data(Config.load(input=[corpus], vocab_file=vocab.path, workers=2,
                                                       output_dir={str(tmp_path / "data")!r}, max_seq_length=64,
                                                       max_predictions_per_seq=10, dupe_factor=1))
        assert manifest.totals("train")["instances"] > 0
        loaded = sorted(m for m in sys.modules if m == "tensorflow" or m.startswith(("tensorflow.", "tf_keras")))
        print("LOADED", loaded)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED []" in done.stdout, done.stdout


def test_the_layout_page_describes_every_module():
    section = (PACKAGE.parent / "docs" / "layout.md").read_text()  # README links it: "How the code is laid out"
    missing = [f"{path.relative_to(PACKAGE)}" for path in PACKAGE.rglob("*.py")
               if path.name not in ("__init__.py", "__main__.py") and path.name not in section]
    assert not missing, f"docs/layout.md does not mention: {missing}"


def test_every_package_docstring_names_its_modules():
    """Each package's ``__init__`` docstring names every module and subpackage in it as ``name`` (with a few words on
    what it is for), the top level included, so a new module cannot arrive unannounced where a reader looks first."""
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        members = [path.stem for path in folder.glob("*.py") if not path.stem.startswith("__")]
        members += [path.name for path in folder.iterdir() if (path / "__init__.py").is_file()]
        missing += [f"{module_name(init)}: ``{name}``" for name in sorted(members) if f"``{name}``" not in docstring]
    assert not missing, "package docstrings that do not name their module or subpackage:\n" + "\n".join(missing)
