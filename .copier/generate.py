"""What Copier runs besides rendering (copier.yml): the project's text after `copier copy` and `copier update`, the
guard of the owner's files when an update removes an extra, and what an update leaves to finish.

Copier writes only the files the project gets: `_exclude` leaves out the template's own files and the paths of the
extras not chosen (`extra_paths`, the same table as pyproject.toml's [tool.lightning_template.extras]), and the
package is written under its own name (`{{ package_name }}` is a link to lightning_template/). Then, in the new
project's folder (and in Copier's renders of the old and the new template during `copier update`, so that their
diffs line up), this script, as copier.yml's task:
1. refuses answers that would make a project that does not work, in one line: a name, an extra, a data choice
   (Copier's questions check the same rules while they are asked: a refusal there asks again; given with -d or
   --defaults, copier.yml's `refused` has Copier write nothing and run this script in the template's folder);
2. in an update that removes extras, refuses before anything is lost if the owner edited or added files among
   theirs, naming them, and puts the project back as it was (its last commit);
3. edits the text of the files Copier wrote: drops the marked blocks of the removed extras (lines from `# extra:NAME`
   or `<!-- extra:NAME -->` to `# /extra:NAME` or `<!-- /extra:NAME -->`; the markers of the extras kept remain,
   so the project's own tests can still drop them) and their entries in pyproject.toml's table, points the
   Makefile's `CONFIG ?=` at the chosen data's job, writes the project's name where the template's stands and
   renames the package (`lightning_template` -> NAME, `lightning-template` -> the distribution name) in the text;
   the README says what the project's data is and which extras it can add;
4. locks the project's own dependency groups: `uv lock` makes uv.lock match its pyproject.toml, keeping the versions the
   template locked (from uv's cache when it holds them, else from the package index); without uv on PATH, the
   project's `make lock` (which puts uv into its venv, as `make` would); where that fails, it says in one line that
   `make lock` must run before the first commit.
The rename needs no formatter: the template's code keeps its lines and import order whatever the package's name
(tests/template/test_copy.py checks the shortest and the longest names with ruff).

As copier.yml's migration after an update (`--after-update`), it names the files where the owner's changes and the
template's met on the same lines, and says how to finish.

Plain Python 3.10 and PyYAML (what Copier runs on); the template's tests run it under Python 3.10 too.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the template's root: its tests/ helpers
from tests.extra_markers import strip_extra_blocks

TEMPLATE = Path(__file__).resolve().parents[1]
PACKAGE = "lightning_template"
DIST = "lightning-template"
ANSWERS = ".copier-answers.yml"
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
# The README's words on the data `make train` starts with, from its sample output to its **Data.** paragraph (the
# template's are Fashion-MNIST's): each other choice's own.
README_DATA_START, README_DATA_END = "On a fresh machine with Python", "\n\n## What you get\n"
README_DATA = {
    "image_folders": """On a fresh machine with Python ≥ 3.11, your images are all that is missing (below).
`make train` ends with where the checkpoints and TensorBoard logs went, and the test accuracy when there is a test
split:

```
best checkpoint: logs/resnet_finetune/version_0/checkpoints/epoch=<n>-val_acc=<value>.ckpt (val_acc=<value>)
last checkpoint: logs/resnet_finetune/version_0/checkpoints/last.ckpt
TensorBoard logs: tensorboard --logdir logs/resnet_finetune/version_0
test accuracy: <value>
```

**Data.** Your images, one folder per class: `data/images/train/<class>/`, `data/images/val/<class>/` and, for a
test accuracy, `data/images/test/<class>/` (`--data.root` points elsewhere). A split whose class folders hold no
images stops the run, naming the folder; crops, flips and normalization statistics are flags
([Fine-tuning](docs/finetuning.md#data-for-fine-tuning)).""",
    "text_files": """On a fresh machine with Python ≥ 3.11 and Debian's `fortunes` package nothing else is needed.
`make train` ends with the test accuracy and where the checkpoints and TensorBoard logs went:

```
best checkpoint: logs/transformer_text/version_0/checkpoints/epoch=<n>-val_acc=<value>.ckpt (val_acc=<value>)
last checkpoint: logs/transformer_text/version_0/checkpoints/last.ckpt
TensorBoard logs: tensorboard --logdir logs/transformer_text/version_0
test accuracy: <value>
```

**Data.** `make text-data` (run by `make train`) writes fortune cookies by topic to `data/fortunes/` as
`train.jsonl`, `val.jsonl` and `test.jsonl`. Yours go in CSV, TSV or JSONL files with a text and a label column:
point `--data.train_file`, `--data.val_file` and `--data.test_file` at them in `configs/transformer_text.yaml`
([Transformer](docs/transformer.md#text-data)).""",
}
# In a project without every extra, its README's last words on updates: the extras it can add, as Copier offers them.
EXTRAS_OFFERED = "**Extras not in this project.**"
TITLE = "Lightning project template"  # the template's name in README.md, docs/index.md, mkdocs.yml, pyproject.toml
# Pages of figures measured on the template: a project's copy says so at its top.
MEASURED = tuple(
    f"docs/{page}.md"
    for page in ("results", "benchmarks", "reliability", "finetuning", "transformer", "scaling", "tools", "experiments",
                 "serving", "language_model")
)  # fmt: skip
MEASURED_NOTE = (
    "The figures on this page were measured on the Lightning project template this project was made from, not on"
    " the project itself: each comes with its command, to measure this project's own."
)
# Marked blocks that no project keeps (the template's own words), and those a project without extras drops.
TEMPLATE_BLOCK, EXTRAS_BLOCK = "template", "extras"
# The template's own files, in no project made from it (copier.yml's _exclude names them too).
TEMPLATE_ONLY = (".ci", ".copier", "copier.yml", "tests/template")
MARKED_SUFFIXES = {".md", ".yml", ".yaml", ".toml", ".py"}
MARKED_NAMES = {"Makefile", ".gitignore"}
MAX_PACKAGE_LENGTH = 24  # lightning_template's 18, and 6 more: the longest name the code's lines leave room for


class Refused(SystemExit):
    """A one-line refusal: Copier shows it above its own line saying the task failed."""

    def __init__(self, message: str) -> None:
        super().__init__(f"generate: {message}")


def questions(template: Path) -> dict:
    return yaml.safe_load((template / "copier.yml").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Project:
    """The answers, as this script uses them."""

    package: str
    slug: str
    name: str
    extras: frozenset[str]  # kept
    data: str
    manifest: dict[str, list[str]]  # every extra -> its paths, in the template

    @property
    def removed(self) -> frozenset[str]:
        return frozenset(self.manifest) - self.extras

    @property
    def blocks(self) -> set[str]:
        """The marked blocks dropped: the removed extras', the template's own, and the words about extras when the
        project keeps none."""
        return set(self.removed) | {TEMPLATE_BLOCK} | ({EXTRAS_BLOCK} if not self.extras else set())

    def path(self, template_path: str) -> str:
        """Where a template file goes in the project."""
        return under_package_renamed(template_path, PACKAGE, self.package)

    def template_path(self, project_path: str) -> str:
        return under_package_renamed(project_path, self.package, PACKAGE)


def under_package_renamed(path: str, old: str, new: str) -> str:
    return new + path[len(old) :] if path == old or path.startswith(f"{old}/") else path


def under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def files_under(root: Path) -> list[str]:
    """Every file below root (not .git, not into linked folders), as posix paths relative to it."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        found += [Path(folder, name).relative_to(root).as_posix() for name in names]
    return sorted(found)


def template_files(template: Path, project: Project, files: Iterable[str] | None = None) -> list[str]:
    """The template's files (`files`, default: all of them) that Copier writes into this project, by their
    template paths."""
    gone = [*TEMPLATE_ONLY, *(path for name in project.removed for path in project.manifest[name])]
    files = files_under(template) if files is None else files
    return [name for name in files if not under(name, gone) and "{{" not in name and (template / name).is_file()]


# -- names ---------------------------------------------------------------------------------------------------


def reserved_names(template: Path) -> set[str]:
    """copier.yml's `reserved_names`: the libraries the project imports, its own folders and scripts, Python's
    keywords and standard library. Never a package name nor a distribution name."""
    return set(questions(template)["reserved_names"]["default"])


def check_project_name(name: str, slug: str, reserved: set[str]) -> None:
    """copier.yml's rule for the project's name and its distribution name (Copier checks it when it asks)."""
    if not name.strip():
        raise Refused("the project's name is empty: give one, e.g. -d project_name='Leaf Disease Classifier'")
    if bad := sorted({c for c in name if c == "\\" or not c.isprintable()}):
        raise Refused(f"the project's name {name!r} holds {bad}: no backslash, tab or other control character")
    if not slug and not name.isascii():  # the distribution's name is the package's, and none was given
        raise Refused(
            f"the project's name {name!r} has letters beyond ASCII, from which no package name is guessed: give one,"
            f" -d package_name={ascii_guess(name) or 'my_project'}"
        )
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug):
        raise Refused(
            f"the project's name {name!r} makes no distribution name: it needs letters or digits of ASCII, e.g."
            " -d project_name='Leaf Disease Classifier'"
        )
    if slug in reserved or slug.replace("-", "_") in reserved:
        raise Refused(
            f"the project's name {name!r} would make the distribution {slug!r}, the name of a library it depends"
            " on, of a module of Python's or of one of its folders: choose another name"
        )


def ascii_guess(name: str) -> str:
    """A package name from a name's letters without their accents ("Réseau Neuronal" -> reseau_neuronal)."""
    plain = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    return re.sub(r"^[^a-z]+", "", re.sub(r"[^a-z0-9]+", "_", plain)).strip("_")[:MAX_PACKAGE_LENGTH].rstrip("_")


def check_package_name(package: str, reserved: set[str]) -> None:
    """copier.yml's rule for the package's name (Copier checks it when it asks)."""
    if not package:
        raise Refused("no package name: the project's name has letters beyond ASCII; give one, -d package_name=...")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", package):
        raise Refused(f"package name {package!r}: lowercase letters, digits and _, starting with a letter")
    if len(package) > MAX_PACKAGE_LENGTH:
        raise Refused(
            f"package name {package!r}: at most {MAX_PACKAGE_LENGTH} characters (the code's lines), e.g."
            f" -d package_name={package[:MAX_PACKAGE_LENGTH].rstrip('_')}"
        )
    if package in reserved:
        raise Refused(
            f"package name {package!r} is taken: a library, a module of Python's or a folder of the project;"
            f" give another, -d package_name=my_{package}"
        )


def meant(name: str, known: Iterable[str]) -> list[str]:
    """The known name a misspelled one is closest to, if one is close."""
    return difflib.get_close_matches(name, list(known), n=1)


# -- the text --------------------------------------------------------------------------------------------------


def is_marked_kind(path: str) -> bool:
    """Whether a file may hold extra markers: Markdown, Makefile, YAML, TOML, and Python (whole statements)."""
    return Path(path).suffix in MARKED_SUFFIXES or Path(path).name in MARKED_NAMES


def drop_manifest_entries(pyproject: str, removed: Iterable[str]) -> str:
    """pyproject.toml's text without the removed extras' entries in [tool.lightning_template.extras]."""
    header = f"[tool.{PACKAGE}.extras]\n"
    start = pyproject.index(header) + len(header)
    end = next((m.start() for m in re.finditer(r"^\[", pyproject[start:], flags=re.M)), len(pyproject) - start)
    table = pyproject[start : start + end]
    for name in removed:
        table = re.sub(rf"^{re.escape(name)} = \[.*?\]\n", "", table, flags=re.M | re.S)
    return pyproject[:start] + table + pyproject[start + end :]


def markdown_text(text: str) -> str:
    """`text` shown as written in Markdown (its *, _, ` and brackets not read as markup)."""
    return re.sub(r"([\\`*_{}\[\]<>#|])", r"\\\1", text)


def quoted(text: str) -> str:
    """A double-quoted string of YAML and of TOML alike."""
    return json.dumps(text, ensure_ascii=False)


def extras_offered(project: Project) -> str:
    """The README's paragraph on the extras a project can add later, with copier.yml's words for each."""
    offered = {value: label for label, value in questions(TEMPLATE)["extra_choices"]["default"].items()}
    example = json.dumps([*sorted(project.extras), sorted(project.removed)[0]])
    lines = [f"- {offered[name]}" for name in offered if name in project.removed]
    return (
        f"{EXTRAS_OFFERED} The template has more; an update adds those named with the ones the project has, e.g.\n\n"
        f"```bash\ncopier update --trust --defaults -d 'extras={example}'\n```\n\n" + "\n".join(lines)
    )


def named(path: str, text: str, project: Project) -> str:
    """The project's name where the template's stands, written as each kind of file reads it."""
    if path in ("README.md", "docs/index.md"):
        text = text.replace(f"# {TITLE}\n", f"# {markdown_text(project.name)}\n", 1)
        if path == "README.md" and project.data in README_DATA:
            start, end = text.index(README_DATA_START), text.index(README_DATA_END)
            text = text[:start] + README_DATA[project.data] + text[end:]
        if path == "README.md" and project.removed:
            text = text.replace("\n## Documentation\n", f"\n{extras_offered(project)}\n\n## Documentation\n", 1)
        return text.replace(DATA_JOBS["fashion_mnist"], DATA_JOBS[project.data])
    if path == "mkdocs.yml":
        return text.replace(f"site_name: {TITLE}\n", f"site_name: {quoted(project.name)}\n", 1)
    if path == "pyproject.toml":
        return re.sub(r'^description = ".*"$', f"description = {quoted(project.name)}", text, count=1, flags=re.M)
    if path in MEASURED:
        heading, _, rest = text.partition("\n\n")
        return f"{heading}\n\n{MEASURED_NOTE}\n\n{rest}"
    return text


def project_text(path: str, text: str, project: Project) -> str:
    """A template file's text as the project has it; `path` is its template path."""
    if is_marked_kind(path):
        stripped = strip_extra_blocks(text, project.blocks)
        if path == "pyproject.toml":
            stripped = drop_manifest_entries(stripped, project.removed)
        if stripped != text:
            text = stripped.rstrip("\n") + "\n"  # a block dropped at the end leaves no blank last line
    if path == "Makefile":
        text, count = re.subn(r"^CONFIG \?= .*$", f"CONFIG ?= {DATA_CONFIGS[project.data]}", text, flags=re.M)
        if count != 1:
            raise ValueError(f"Makefile: expected one `CONFIG ?=` line, found {count}")
    return named(path, text, project).replace(PACKAGE, project.package).replace(DIST, project.slug)


def write_project_text(root: Path, template: Path, project: Project) -> None:
    """Edit, in place, the text of every file Copier wrote from the template (not the owner's own files)."""
    for path in template_files(template, project):
        target = root / project.path(path)
        if not target.is_file():
            continue
        try:
            text = target.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        new = project_text(path, text, project)
        if new != text:
            target.write_text(new, encoding="utf-8")


def uv_command() -> str | None:
    """uv: the one the caller names (uv sets $UV for what it runs), on PATH, or beside this Python (a venv's)."""
    beside = Path(sys.executable).parent / "uv"
    return os.environ.get("UV") or shutil.which("uv") or (str(beside) if beside.is_file() else None)


def lock(root: Path) -> None:
    """uv.lock for the project's own groups: the template's lock re-resolved against the project's pyproject.toml
    (uv keeps the versions locked there); offline first, so that a warm cache needs no network. Without uv, the
    project's `make lock`, which puts uv into the project's venv as every `make` target does, then locks."""
    if not (root / "uv.lock").is_file():
        return
    uv = uv_command()
    commands = [[uv, "lock", "--quiet", "--offline"], [uv, "lock", "--quiet"]] if uv else [["make", "-s", "lock"]]
    done = None
    for command in commands:
        try:
            done = subprocess.run(command, cwd=root, capture_output=True, text=True)
        except OSError as err:  # no make
            done = subprocess.CompletedProcess(command, 1, "", f"{command[0]}: {err.strerror}")
        if done.returncode == 0:
            return
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()] if done else []
    why = next((line for line in reversed(lines) if not line.startswith("make")), "uv lock failed")
    print(f"uv.lock is still the template's ({why}): in {root.name}/, run `make lock` before the first commit.",
          file=sys.stderr)  # fmt: skip


# -- copier update -----------------------------------------------------------------------------------------------


def git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=check)


def is_the_owners_repository(root: Path) -> bool:
    """Whether `root` is the project's own checkout (Copier's renders of the old and new template are not)."""
    top = git(root, "rev-parse", "--show-toplevel", check=False)
    return top.returncode == 0 and Path(top.stdout.strip()).resolve() == root.resolve()


def committed(root: Path, path: str) -> str | None:
    shown = git(root, "show", f"HEAD:{path}", check=False)
    return shown.stdout if shown.returncode == 0 else None


def owners_files_of(root: Path, template: Path, project: Project) -> tuple[list[str], list[str]]:
    """The extras this update removes, and the files the owner made theirs among theirs: edited (neither the old
    template's text nor the new one's, as this project would have them) or added."""
    answers = yaml.safe_load(committed(root, ANSWERS) or "") or {}
    gone = sorted(set(answers.get("extras") or []) - project.extras)
    if not gone:
        return [], []
    earlier = Project(**{**project.__dict__, "extras": frozenset(answers.get("extras") or [])})
    paths = [project.path(path) for name in gone for path in project.manifest.get(name, [])]
    listed = git(root, "ls-tree", "-r", "-z", "--name-only", "HEAD", "--", *paths).stdout.split("\0")
    old_commit = str(answers.get("_commit", "")).rsplit("-g", 1)[-1]
    theirs = []
    for path in filter(None, listed):
        source = project.template_path(path)
        mine = committed(root, path)
        versions = [(template / source).read_text(encoding="utf-8")] if (template / source).is_file() else []
        old = git(template, "show", f"{old_commit}:{source}", check=False) if old_commit else None
        if old is not None and old.returncode == 0:
            versions.append(old.stdout)
        pristine = {project_text(source, text, earlier) for text in versions}
        if mine not in pristine:
            theirs.append(path)
    return gone, theirs


def refuse_to_remove_the_owners_files(root: Path, gone: list[str], theirs: list[str]) -> None:
    """Put the project back as it was before the update (its last commit, which Copier required clean) and
    refuse, naming the files and the ways to go on."""
    git(root, "checkout", "-q", "HEAD", "--", ".")
    git(root, "clean", "-q", "-fd", "--", ".")  # what the render added; ignored files (.venv, data, logs) stay
    shown = "\n".join(f"  {path}" for path in theirs)
    raise SystemExit(
        f"copier update: the extras you remove ({', '.join(gone)}) hold files you edited or"
        f" added:\n{shown}\nNothing was changed. To go on, keep what you need outside those extras' folders, or"
        " delete the files (git rm), commit, and run the update again; or keep the extras."
    )


def report_update(root: Path) -> None:
    """After `copier update`: the extras it removed or added, the files where the owner's lines and the template's
    met, and how to finish."""
    before = set((yaml.safe_load(committed(root, ANSWERS) or "") or {}).get("extras") or [])
    after = set((yaml.safe_load((root / ANSWERS).read_text(encoding="utf-8")) or {}).get("extras") or [])
    for verb, names in (("removed", before - after), ("added", after - before)):
        if names:
            print(f"copier update: {verb} the extras {', '.join(sorted(names))} (`git status` lists their files).")
    unmerged = sorted(set(git(root, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()))
    rejected = sorted(str(p.relative_to(root)) for p in root.rglob("*.rej") if ".git" not in p.parts)
    if unmerged:
        files = "1 file has" if len(unmerged) == 1 else f"{len(unmerged)} files have"
        print(
            f"copier update: {files} lines that you and the template both changed:\n"
            + "\n".join(f"  {path}" for path in unmerged)
            + "\nIn each, keep what you want between `<<<<<<< before updating` and `>>>>>>> after updating` (your"
            " lines, then the template's), delete the markers, then `git add` the files and commit.",
            file=sys.stderr,
        )
    if rejected:
        print(
            "copier update: changes that could not be applied are in "
            + ", ".join(rejected)
            + ": apply them by hand, then delete the .rej files.",
            file=sys.stderr,
        )


# -- the command -------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--template", type=Path, required=True, help="The template's folder (Copier's src_path).")
    parser.add_argument("--after-update", action="store_true", help="Copier's migration: report the conflicts.")
    parser.add_argument("--package", default=PACKAGE)
    parser.add_argument("--slug", default=DIST, help="The distribution name, pyproject.toml's [project] name.")
    parser.add_argument("--name", default=TITLE, help="The project's name.")
    parser.add_argument("--extras", default="", help="The extras kept, comma-separated.")
    parser.add_argument("--data", default="fashion_mnist", help=f"One of {', '.join(DATA_CONFIGS)}.")
    parser.add_argument("--operation", default="copy", help="Copier's: copy or update.")
    parser.add_argument("--refused", default="", help="copier.yml's verdict on the answers: why they cannot work.")
    args = parser.parse_args(argv)
    root = Path.cwd()
    if args.after_update:
        report_update(root)
        return
    reserved = reserved_names(args.template)
    check_project_name(args.name, args.slug, reserved)
    check_package_name(args.package, reserved)
    manifest = questions(args.template)["extra_paths"]["default"]
    extras = frozenset(name.strip() for name in args.extras.split(",") if name.strip())
    if unknown := extras - manifest.keys():
        fixed = sorted((extras - unknown) | {close for name in unknown for close in meant(name, manifest)})
        raise Refused(
            f"no such extra: {', '.join(sorted(unknown))} (the extras: {', '.join(manifest)}); a YAML list of them,"
            f" e.g. -d 'extras={json.dumps(fixed or sorted(manifest)[:1])}'"
        )
    if args.data not in DATA_CONFIGS:
        fixed = (meant(args.data, DATA_CONFIGS) or list(DATA_CONFIGS))[0]
        raise Refused(f"no such data: {args.data} (one of {', '.join(DATA_CONFIGS)}), e.g. -d data={fixed}")
    if args.refused:  # a rule of copier.yml's that the checks above do not know: nothing was written
        raise Refused(args.refused)
    name = " ".join(args.name.split())  # as typed, but for spaces around it and runs of them inside
    project = Project(args.package, args.slug, name, extras, args.data, manifest)
    if args.operation == "update" and is_the_owners_repository(root):  # not Copier's renders of old and new
        gone, theirs = owners_files_of(root, args.template, project)
        if theirs:
            refuse_to_remove_the_owners_files(root, gone, theirs)
    write_project_text(root, args.template, project)
    lock(root)


if __name__ == "__main__":
    main()
