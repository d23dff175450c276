"""How far the engine reaches into Lightning, measured from the source: `python -m tests.engine_boundary`.

Read statically (ast), with two facts from the installed packages: which private names Lightning, torchmetrics and
torch use in their own source (a `._name` the engine reads is theirs if they use it and the engine never defines
it), and ruff's McCabe complexity of each function. tests/test_lightning_internals.py asserts the boundary with
the same reading (`non_public_reads`); this prints the figures:
- the distinct private (underscored) names of Lightning, torchmetrics and torch the engine touches;
- the reads of non-public state outside engine/lightning_internals.py (a `._name` of theirs, a private module or
  name imported from them, an attribute of a loop, a loop's progress or a trainer's connector);
- the adapter's functions and classes named in a test under tests/ (the behaviour tests);
- the tripwires (tests named `test_tripwire_*`: plain Lightning, asserting a bug the engine corrects is still there);
- the engine's longest function and highest complexity, and its lines.
`python -m tests.engine_boundary --check` fails on an engine function over 60 lines or complexity 15 as radon counts
it (`make lint`).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "lightning_template" / "engine"
ADAPTER = ENGINE / "lightning_internals.py"
THEIRS = ("lightning", "torch", "torchmetrics")  # the packages whose private state counts
# Non-public without an underscore: the loops (`trainer.fit_loop`, its `epoch_loop`, `val_loop`...), their progress
# counters (`epoch_progress`, `batch_progress`, `scheduler_progress`) and the trainer's connectors.
NON_PUBLIC_SUFFIXES = ("_loop", "_progress", "_connector")


@functools.cache
def private_names_of(package: str) -> frozenset[str]:
    """Every `_name` (not `__dunder__`) that a package uses in its own Python source."""
    names: set[str] = set()
    pattern = re.compile(r"\b(_[A-Za-z][A-Za-z0-9_]*)")
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    for folder in spec.submodule_search_locations:
        for file in Path(folder).rglob("*.py"):
            names.update(n for n in pattern.findall(file.read_text(errors="replace")) if not n.endswith("__"))
    return frozenset(names)


def their_private_names() -> frozenset[str]:
    return frozenset().union(*(private_names_of(package) for package in THEIRS))


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


@dataclass(frozen=True)
class Read:
    file: str
    line: int
    what: str  # the dotted expression, or `from module import name`
    private: tuple[str, ...]  # their private names in it
    package: str = "lightning"  # whose: torch where the chain starts at torch or the import is from it


def dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover
        return type(node).__name__


def imported_modules(tree: ast.Module) -> dict[str, str]:
    """Local name -> the module it was imported from (`import os`: os; `from lightning.pytorch.trainer import call`:
    lightning.pytorch.trainer)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.partition(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = node.module
    return bound


def own_private_names(trees: list[ast.Module]) -> set[str]:
    """The private names the engine defines itself: `self._x = ...`, `def _x`, `class _X`, module-level `_X = ...`."""
    own = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and is_private(node.name):
                own.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name) and is_private(leaf.id):
                            own.add(leaf.id)
                        is_self = isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                        if is_self and leaf.value.id in ("self", "cls") and is_private(leaf.attr):
                            own.add(leaf.attr)
    return own


def chain_reads(tree: ast.Module, file: str, own: set[str]) -> Iterator[Read]:
    """Each outermost attribute chain that reads non-public state of theirs (once per chain)."""
    theirs, imported = their_private_names(), imported_modules(tree)
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            inner.add(id(node.value))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        links, root = [], node
        while isinstance(root, ast.Attribute):
            links.append(root)
            root = root.value
        package = imported.get(root.id, "") if isinstance(root, ast.Name) else ""
        if package and package.partition(".")[0] not in (*THEIRS, "lightning_template"):
            continue  # `os._exit`, `sys._getframe`: the standard library's
        # Of theirs whatever the engine defines: `super()._x`, `call._x` (a module of theirs).
        on_theirs = package.partition(".")[0] in THEIRS or (isinstance(root, ast.Call) and dotted(root.func) == "super")
        private, non_public = [], False
        for link in reversed(links):  # from the root outwards
            on_self = isinstance(link.value, ast.Name) and link.value.id in ("self", "cls")
            if is_private(link.attr) and link.attr in theirs and (link.attr not in own or on_theirs) and not on_self:
                private.append(link.attr)
            # A loop, a loop's progress or a connector (`trainer.fit_loop`, `loop.epoch_progress`), or what is in it.
            if link.attr.endswith(NON_PUBLIC_SUFFIXES) and not on_self:
                non_public = True
        if private or non_public:
            owner = "torch" if package.partition(".")[0] == "torch" else "lightning"
            yield Read(file, node.lineno, dotted(node), tuple(private), owner)


def import_reads(tree: ast.Module, file: str) -> Iterator[Read]:
    """`from torch._utils import x`, `from torch.nn.modules.batchnorm import _BatchNorm`: their private modules and
    names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.partition(".")[0] in THEIRS:
            private = [part for part in node.module.split(".") if is_private(part)]
            private += [alias.name for alias in node.names if is_private(alias.name)]
            if private:
                names = ", ".join(alias.name for alias in node.names)
                owner = node.module.partition(".")[0]
                yield Read(file, node.lineno, f"from {node.module} import {names}", tuple(private), owner)


def engine_trees() -> dict[Path, ast.Module]:
    return {file: ast.parse(file.read_text(), str(file)) for file in sorted(ENGINE.rglob("*.py"))}


def all_reads() -> list[Read]:
    """Every read of their non-public state in the engine, the adapter's included."""
    trees = engine_trees()
    own = own_private_names(list(trees.values()))
    reads = []
    for file, tree in trees.items():
        name = str(file.relative_to(ROOT))
        reads += [*chain_reads(tree, name, own), *import_reads(tree, name)]
    return sorted(reads, key=lambda r: (r.file, r.line))


def non_public_reads() -> list[Read]:
    """What the engine reads of their non-public state outside the adapter (the boundary: none)."""
    adapter = str(ADAPTER.relative_to(ROOT))
    return [read for read in all_reads() if read.file != adapter]


def adapter_definitions() -> list[str]:
    tree = ast.parse(ADAPTER.read_text())
    kinds = (ast.FunctionDef, ast.ClassDef)
    return [node.name for node in tree.body if isinstance(node, kinds)]


def names_in_tests() -> set[str]:
    """Every name a test function (`def test_*` under tests/) reads: `f(...)` and `module.f(...)` alike."""
    names = set()
    for file in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                for leaf in ast.walk(node):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
                    elif isinstance(leaf, ast.Attribute):
                        names.add(leaf.attr)
    return names


def tripwires() -> list[str]:
    found = []
    for file in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_tripwire_"):
                found.append(f"{file.relative_to(ROOT)}::{node.name}")
    return found


def functions(trees: dict[Path, ast.Module]) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """Every function of the engine (methods and nested ones too), with where it is: `file:line name`."""
    for file, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield node, f"{file.relative_to(ROOT)}:{node.lineno} {node.name}"


def longest_functions(trees: dict[Path, ast.Module]) -> list[tuple[int, str]]:
    lengths = [(node.end_lineno - node.lineno + 1, where) for node, where in functions(trees)]  # type: ignore[operator]
    return sorted(lengths, reverse=True)


def complexities() -> list[tuple[int, str]]:
    """ruff's McCabe complexity (C901) of every engine function."""
    ruff = Path(sys.executable).parent / "ruff"
    command = [str(ruff), "check", "--isolated", "--select", "C901", "--output-format", "json"]
    command += ["--config", "lint.mccabe.max-complexity = 0", str(ENGINE)]
    found = json.loads(subprocess.run(command, capture_output=True, text=True, check=False).stdout or "[]")
    scored = []
    for item in found:
        match = re.search(r"`(.+)` is too complex \((\d+) > 0\)", item["message"])
        if match:
            where = f"{Path(item['filename']).relative_to(ROOT)}:{item['location']['row']} {match[1]}"
            scored.append((int(match[2]), where))
    return sorted(scored, reverse=True)


BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.Assert, ast.match_case)


def radon_complexity(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Cyclomatic complexity as radon counts it: ruff's (McCabe's) plus each `and`/`or` and each comprehension's
    loop and condition, nested functions included."""
    score = 1
    for node in ast.walk(function):
        if isinstance(node, BRANCHES):
            score += 1
        elif isinstance(node, ast.comprehension):
            score += 1 + len(node.ifs)
        elif isinstance(node, ast.BoolOp):
            score += len(node.values) - 1
    return score


def radon_complexities(trees: dict[Path, ast.Module]) -> list[tuple[int, str]]:
    return sorted(((radon_complexity(node), where) for node, where in functions(trees)), reverse=True)


MAX_LINES, MAX_COMPLEXITY = 60, 15  # what a reader holds in mind: `make lint` checks them (`--check`)


def too_long_or_complex(trees: dict[Path, ast.Module]) -> list[str]:
    # Ruff's C901 (McCabe) counts no `and`/`or`: the check reads radon's count, the higher of the two.
    over = [f"complexity {score}: {where}" for score, where in radon_complexities(trees) if score > MAX_COMPLEXITY]
    return over + [f"{lines} lines: {where}" for lines, where in longest_functions(trees) if lines > MAX_LINES]


def check() -> None:
    """Exit with an error naming each engine function over 60 lines or complexity 15."""
    if over := too_long_or_complex(engine_trees()):
        sys.exit(
            f"Engine functions over {MAX_LINES} lines or complexity {MAX_COMPLEXITY} (split them):\n  "
            + "\n  ".join(over)
        )


def main() -> None:
    if "--check" in sys.argv[1:]:
        check()
        return
    trees = engine_trees()
    reads = all_reads()
    outside = non_public_reads()
    private = sorted({name for read in reads for name in read.private})
    adapter = adapter_definitions()
    tested = names_in_tests()
    behaviour = [name for name in adapter if name in tested]
    wires = tripwires()
    lengths, scores = longest_functions(trees), complexities()
    lines = sum(len(file.read_text().splitlines()) for file in trees)
    lightning = sorted({name for read in reads if read.package != "torch" for name in read.private})
    print(f"distinct private names of {'/'.join(THEIRS)} the engine touches: {len(private)}")
    print(f"  of Lightning (and torchmetrics): {len(lightning)}: {' '.join(lightning)}")
    print(f"  of torch: {' '.join(name for name in private if name not in lightning)}")
    print(f"non-public reads outside {ADAPTER.relative_to(ROOT)}: {len(outside)}")
    for read in outside:
        print(f"  {read.file}:{read.line}: {read.what}")
    print(f"adapter functions and classes named in a test: {len(behaviour)} of {len(adapter)}")
    print(f"  untested: {' '.join(name for name in adapter if name not in tested)}")
    print(f"tripwires (test_tripwire_*): {len(wires)}")
    for wire in wires:
        print(f"  {wire}")
    print(f"longest engine function: {lengths[0][0]} lines ({lengths[0][1]})")
    print(f"highest complexity (ruff C901): {scores[0][0]} ({scores[0][1]})")
    radon = radon_complexities(trees)
    print(f"highest complexity (as radon counts, with each and/or): {radon[0][0]} ({radon[0][1]})")
    for score, where in [item for item in radon if item[0] > MAX_COMPLEXITY]:
        print(f"  {score} {where}")
    over = too_long_or_complex(trees)
    print(f"engine functions over complexity {MAX_COMPLEXITY} or {MAX_LINES} lines: {len(over)}")
    for item in over:
        print(f"  {item}")
    print(f"engine lines: {lines}")


if __name__ == "__main__":
    main()
