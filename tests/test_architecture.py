"""The package's layout, read from its own source: layered imports without a circle, a package
face that only re-exports (and does not import torch), and modules short enough to read."""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import sys
import tomllib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "promptlookup"

#: Each module may import modules of its own layer or of lower ones, never of higher ones.
LAYERS = [
    ["_version", "errors", "limits", "machine", "cache_files", "text", "rendering", "prompts"],
    [
        "backend_names",
        "sampling",
        "rejection",
        "cost_model",
        "cost_store",
        "acceptance",
        "models",
        "tokenizer_cache",
        "drafters.base",
        "drafters.suffix_index",
        "drafters.prompt_lookup",
        "json_schemas",
        "grammar",
        # The prefix cache knows no backend: the target says whether it reuses prefixes, the
        # sequence's cache reads and writes the blocks.
        "prefix_tree",
        "prefix_keys",
        "prefix_disk",
        "prefix_cache",
    ],
    # The target backends (forward passes over a KV cache), one folder per engine:
    ["backends", "backends.base"],  # the Target protocol the loop speaks
    ["backends.gguf"],  # our engine: GGUF reading, our modules, the row-invariant pass, its C
    ["backends.inexact"],  # kernels chosen by timing, whatever their rounding
    ["backends.hf", "backends.llamacpp"],  # the targets over transformers and llama.cpp
    [
        "drafters",
        "drafters.draft_model",
        "policy",
        "calibration",
        "loop",
        "batching",
    ],
    ["results", "generation"],
    ["loading", "hf_batch", "hf_generate"],
    ["cli", "demo", "server", "bench", "vllm", "__main__", ""],  # "": the package face
]
#: Imports that run up the layers on purpose, each with its reason.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere (functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [
                alias.name.removeprefix("promptlookup").lstrip(".")
                for alias in node.names
                if alias.name.split(".")[0] == "promptlookup"
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "promptlookup":
                module = node.module.removeprefix("promptlookup").lstrip(".")
            else:
                continue
            targets = [
                f"{module}.{alias.name}".lstrip(".")
                for alias in node.names
                if f"{module}.{alias.name}".lstrip(".") in known
            ] or [module]
        found.update(target for target in targets if target in known and target != name)
    return found


def layer_of(name: str) -> int:
    if name == "":
        return len(LAYERS) - 1
    for depth in range(name.count(".") + 1, 0, -1):
        prefix = ".".join(name.split(".")[:depth])
        for index, layer in enumerate(LAYERS):
            if prefix in layer:
                return index
    raise AssertionError(f"module {name!r} is in no layer of {__name__}.LAYERS")


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def test_no_module_imports_upward():
    upward = sorted(
        (name, target)
        for name, targets in graph().items()
        for target in targets
        if layer_of(target) > layer_of(name) and (name, target) not in ALLOWED_UPWARD
    )
    assert upward == [], "imports up the layers: " + ", ".join(f"{a} -> {b}" for a, b in upward)


def test_no_backend_imports_the_api_or_model_loading():
    for name, targets in graph().items():
        if name.startswith("backends"):
            assert not {"generation", "models"} & targets, name


def test_no_import_circle():
    edges = graph()
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges.get(name, ())):
            if (name, target) in ALLOWED_UPWARD:
                continue
            assert state.get(target) != 1, "import circle: " + " -> ".join(path + [target])
            if target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])


def test_the_prefix_cache_imports_no_backend_and_no_drafter():
    edges, seen, todo = (
        graph(),
        set(),
        ["prefix_cache", "prefix_tree", "prefix_disk"],
    )  # and prefix_keys
    while todo:  # everything they import, directly or not
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(edges[name])
    assert {"prefix_cache", "prefix_tree", "prefix_disk"} <= seen
    assert [name for name in seen if name.startswith(("backends", "drafters"))] == []
    code = "import sys, promptlookup.prefix_cache; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_package_face_only_re_exports():
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    functions = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert functions == ["__getattr__", "__dir__"]


def test_the_package_imports_without_torch():
    code = (
        "import sys, promptlookup; promptlookup.__version__; promptlookup.InvalidParameterError\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


#: Modules allowed over 400 lines, to be split.
TO_SPLIT: set[str] = set()


def test_no_module_over_400_lines():
    long = {
        name: lines
        for name, path in modules().items()
        if (lines := len(path.read_text().splitlines())) > 400 and name not in TO_SPLIT
    }
    assert long == {}


#: The engines, each a folder of ``backends/`` (beside ``base.py``, the Target protocol).
ENGINES = {"gguf", "hf", "inexact", "llamacpp"}


def test_backends_has_a_folder_per_engine():
    backends = PACKAGE / "backends"
    folders = {path.name for path in backends.iterdir() if path.is_dir()} - {"__pycache__"}
    assert folders == ENGINES
    assert {path.name for path in backends.glob("*.py")} == {"__init__.py", "base.py"}
    assert all((backends / engine / "__init__.py").is_file() for engine in ENGINES)


def c_files() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.c"), *PACKAGE.rglob("*.h")])


def test_no_c_source_includes_another():
    included = re.compile(r'^\s*#\s*include\s*"[^"]*\.c"', re.M)
    assert [path.name for path in c_files() if included.search(path.read_text())] == []


def test_the_c_sources_ship_with_the_package():
    pyproject = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["promptlookup"]
    unshipped = [
        str(path.relative_to(PACKAGE))
        for path in c_files()
        if not any(fnmatch.fnmatch(str(path.relative_to(PACKAGE)), glob) for glob in globs)
    ]
    assert c_files() and unshipped == []
