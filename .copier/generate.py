"""Copier's post-generation task: make the rendered copy of this repository the project that was asked for.

Run by copier.yml's `_tasks` in the new project's folder (`copier copy --trust`, and again in `copier update`,
where Copier renders the old and the new template version the same way, so that their diffs line up):

    python .copier/generate.py --template <template folder> --package NAME --slug NAME --extras a,b --data KEY

It touches only the files the template has (a project's own files, its .venv, data and logs are left alone):
1. removes the extras that were left out: their paths in pyproject.toml's [tool.lightning_template.extras] (what
   an extra is, stated once), their entries in that table, and their marked blocks in Markdown, Makefile, YAML
   and TOML files: lines from `# extra:NAME` (`<!-- extra:NAME -->`) to `# /extra:NAME` (`<!-- /extra:NAME -->`);
   the markers of the extras kept remain, so the project's own tests can still drop them (tests/test_docs.py);
2. points the Makefile's `CONFIG ?=` (what `make train` runs) at the chosen data's job;
3. renames the package: `lightning_template` -> NAME in every file and path, `lightning-template` -> the slug,
   then sorts imports and formats the Python files with ruff (a name of another length or alphabetical place
   moves lines), where ruff can be found.

The code stays plain Python: the repository itself is the full project, and runs as one. tests/test_layers.py
removes extras from a copy of the repository with `remove_extras`, the same rule as here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import tomllib
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the template's root: its tests/ helpers
from tests.extra_markers import strip_extra_blocks

PACKAGE = "lightning_template"
DIST = "lightning-template"
# The data a project starts with -> the job `make train` runs (CONFIG ?= in the Makefile), and what the README's
# quick start says it trains.
DATA_CONFIGS = {
    "fashion_mnist": "configs/simple_cnn.yaml",
    "image_folders": "configs/resnet_finetune.yaml",
    "text_files": "configs/transformer_text.yaml",
}
DATA_JOBS = {
    "fashion_mnist": "trains SimpleCNN on Fashion-MNIST",
    "image_folders": "fine-tunes a ResNet on your images in data/images/",
    "text_files": "trains a transformer on text (fortune cookies until you point it at yours)",
}
TITLE = "Lightning project template"  # the README's, the site's and its home page's: the project's name instead
# Marked blocks that no project keeps (the template's own words), and those a project without extras drops.
TEMPLATE_BLOCK, EXTRAS_BLOCK = "template", "extras"
# The template's own files, in no project made from it (copier.yml's _exclude names them too).
TEMPLATE_ONLY = (".ci", ".copier", "copier.yml", "tests/test_copier.py")
MARKED_SUFFIXES = {".md", ".yml", ".yaml", ".toml"}
MARKED_NAMES = {"Makefile", ".gitignore"}
# Never a package name: copier.yml's `reserved_names` (the libraries the project imports, its own folders and
# scripts, Python's keywords and standard library), the list its questions check.
RESERVED = set(
    yaml.safe_load((Path(__file__).resolve().parents[1] / "copier.yml").read_text())["reserved_names"]["default"]
)


def read_extras(root: Path) -> dict[str, list[str]]:
    """pyproject.toml's [tool.lightning_template.extras]: extra name -> its paths."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    return dict(pyproject["tool"][PACKAGE].get("extras", {}))


def is_marked_kind(path: str | Path) -> bool:
    """Whether a file may hold extra markers: Markdown, Makefile, YAML, TOML (never Python)."""
    path = Path(path)
    return path.suffix in MARKED_SUFFIXES or path.name in MARKED_NAMES


def drop_manifest_entries(pyproject: str, removed: set[str]) -> str:
    """pyproject.toml's text without the removed extras' entries in [tool.lightning_template.extras]."""
    header = f"[tool.{PACKAGE}.extras]\n"
    start = pyproject.index(header) + len(header)
    end = next((m.start() for m in re.finditer(r"^\[", pyproject[start:], flags=re.M)), len(pyproject) - start)
    table = pyproject[start : start + end]
    for name in removed:
        table = re.sub(rf"^{re.escape(name)} = \[.*?\]\n", "", table, flags=re.M | re.S)
    return pyproject[:start] + table + pyproject[start + end :]


def under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def files_under(root: Path) -> list[str]:
    """Every file below root (not .git), as posix paths relative to it."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        found += [Path(folder, name).relative_to(root).as_posix() for name in names]
    return sorted(found)


def prune_empty_folders(root: Path, files: Iterable[str]) -> None:
    """Remove the folders of the given files that are left empty, deepest first (never root)."""
    folders = {parent for name in files for parent in Path(name).parents if parent != Path()}
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        with_root = root / folder
        if with_root.is_dir() and not any(with_root.iterdir()):
            with_root.rmdir()


def removed_blocks(extras: Iterable[str], removed: Iterable[str]) -> set[str]:
    """The marked blocks a project drops: its removed extras', the template's own, and the words about extras
    when it keeps none."""
    removed = set(removed)
    return removed | {TEMPLATE_BLOCK} | ({EXTRAS_BLOCK} if set(extras) <= removed else set())


def remove_extras(
    root: Path, removed: Iterable[str], files: Iterable[str] | None = None, blocks: set[str] | None = None
) -> list[str]:
    """Remove the extras `removed` from the project at root: their paths, their entries in pyproject.toml's
    manifest and their marked blocks (or `blocks`). `files` (paths relative to root) limits what is touched;
    default: every file. Returns the files left."""
    extras = read_extras(root)
    removed = set(removed)
    if unknown := removed - extras.keys():
        raise ValueError(f"no such extra: {sorted(unknown)} (extras: {sorted(extras)})")
    blocks = removed if blocks is None else blocks
    files = files_under(root) if files is None else sorted(files)
    gone_paths = [path for name in removed for path in extras[name]]
    gone = [name for name in files if under(name, gone_paths)]
    for name in gone:
        (root / name).unlink(missing_ok=True)
    prune_empty_folders(root, gone)
    left = [name for name in files if name not in set(gone)]
    for name in left:
        path = root / name
        if is_marked_kind(name) and path.is_file():
            text = path.read_text()
            stripped = strip_extra_blocks(text, blocks)
            if name == "pyproject.toml":
                stripped = drop_manifest_entries(stripped, removed)
            if stripped != text:
                path.write_text(one_last_newline(stripped))
    return left


def one_last_newline(text: str) -> str:
    """A block dropped at the end of a file leaves no blank last line."""
    return text.rstrip("\n") + "\n"


def set_default_config(makefile: Path, config: str) -> None:
    """The Makefile's `CONFIG ?=` line -> config."""
    text, count = re.subn(r"^CONFIG \?= .*$", f"CONFIG ?= {config}", makefile.read_text(), flags=re.M)
    if count != 1:
        raise ValueError(f"{makefile}: expected one `CONFIG ?=` line, found {count}")
    makefile.write_text(text)


def finish_text(root: Path, files: Iterable[str], package: str, slug: str, name: str, data: str) -> None:
    """Rename the package and the distribution in the text; the project's name where the template's stands (the
    README's, the site's and its home page's titles); the quick start's job for the chosen data."""
    for file in files:
        path = root / file
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # not text
        new = text.replace(PACKAGE, package).replace(DIST, slug)
        if file in ("README.md", "docs/index.md", "mkdocs.yml"):
            new = new.replace(TITLE, name).replace(DATA_JOBS["fashion_mnist"], DATA_JOBS[data])
        if new != text:
            path.write_text(new)


def rename_paths(root: Path, files: Iterable[str], package: str) -> list[str]:
    """Move the files whose path names the package to the new name's path; returns the new file list."""
    moved, renamed = [], []
    for name in files:
        new = name.replace(PACKAGE, package)
        if new != name and (root / name).is_file():
            (root / new).parent.mkdir(parents=True, exist_ok=True)
            os.replace(root / name, root / new)
            moved.append(name)
        renamed.append(new)
    prune_empty_folders(root, moved)
    return renamed


def ruff_command() -> list[str] | None:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    return [found] if found else None


def tidy_python(root: Path, files: Iterable[str]) -> None:
    """Sort imports and format the Python files with ruff (the project's settings), if ruff is installed."""
    python = [name for name in files if name.endswith(".py") and (root / name).is_file()]
    ruff = ruff_command()
    if not python:
        return
    if ruff is None:
        print("generate: ruff is not installed here; run `make format` once in the new project", file=sys.stderr)
        return
    subprocess.run(
        [*ruff, "check", "--no-cache", "--fix", "--select", "I", "--quiet", "--", *python], cwd=root, check=True
    )
    subprocess.run([*ruff, "format", "--no-cache", "--quiet", "--", *python], cwd=root, check=True)


def check_package_name(package: str) -> None:
    """copier.yml's rule (Copier checks it at the question; a project generated by hand is checked here)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", package):
        raise SystemExit(f"generate: {package!r} cannot be the package name (lowercase letters, digits, _)")
    if package in RESERVED:
        raise SystemExit(f"generate: {package!r} is taken: a library, a module of Python's or a folder of the project")
    if len(package) > len(PACKAGE) + 6:
        raise SystemExit(f"generate: {package!r} is too long for the code's line length (at most 24 characters)")


def generate(
    root: Path,
    template: Path,
    package: str,
    slug: str,
    extras: set[str],
    data: str,
    files: Iterable[str],
    name: str = TITLE,
) -> list[str]:
    """Turn the rendered copy at root into the project asked for; returns its template files, as renamed."""
    check_package_name(package)
    manifest = read_extras(template)
    if unknown := extras - manifest.keys():
        raise SystemExit(f"generate: no such extra: {sorted(unknown)} (extras: {sorted(manifest)})")
    if data not in DATA_CONFIGS:
        raise SystemExit(f"generate: no such data choice: {data!r} (choices: {sorted(DATA_CONFIGS)})")
    removed = manifest.keys() - extras
    left = remove_extras(root, removed, files, removed_blocks(manifest, removed))
    set_default_config(root / "Makefile", DATA_CONFIGS[data])
    finish_text(root, left, package, slug, name, data)
    renamed = rename_paths(root, left, package)
    if package != PACKAGE:
        tidy_python(root, renamed)
    return renamed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--template", type=Path, required=True, help="The template's folder (Copier's src_path).")
    parser.add_argument("--package", required=True)
    parser.add_argument("--slug", required=True, help="The distribution name, pyproject.toml's [project] name.")
    parser.add_argument("--extras", default="", help="The extras kept, comma-separated.")
    parser.add_argument("--data", default="fashion_mnist", choices=sorted(DATA_CONFIGS))
    parser.add_argument("--name", default=TITLE, help="The project's name (the README's title).")
    args = parser.parse_args(argv)
    root = Path.cwd()
    # What this template wrote here: its files (as Copier renders them, same paths) that are present.
    files = [name for name in files_under(args.template) if (root / name).is_file()]
    extras = {name.strip() for name in args.extras.split(",") if name.strip()}
    generate(root, args.template, args.package, args.slug, extras, args.data, files, args.name)


if __name__ == "__main__":
    main()
