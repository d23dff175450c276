"""`copier copy`: what a new owner gets, for every choice of extras, every name a user can type, and on the oldest
Python Copier runs on.

A project has only the extras chosen (Copier writes nothing else: what it lists is what the project has), no word
of the others in any file (code comments and docstrings included), its own package name everywhere, its own name
in every file that names it, written as that file reads it; it installs from its own pyproject.toml, lints clean and
passes its own tests with its own `make` targets, as its README runs them.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import jinja2
import pytest
import yaml
from jinja2_ansible_filters import AnsibleCoreFiltersExtension

from tests.conftest import ROOT
from tests.extra_markers import markers_in
from tests.template.projects import (
    EXTRAS,
    GENERATE,
    GIT_IDENTITY,
    QUESTIONS,
    SUBPROCESS_TIMEOUT,
    commit_tree,
    copier_cli,
    git,
    make_project,
    project_files,
    text_of,
    without_system_data,
)

# (a) the core alone, the package name derived from the project's; (b) every extra, a longer name; (c) the hf extra
# alone, on text; (d) the hf extra with serving (its checkpoints served and exported).
CORE = {"project_name": "Zeta Vision", "extras": [], "data": "fashion_mnist"}
FULL = {
    "project_name": "ACME Research", "package_name": "acme_imaging_experiments", "extras": sorted(EXTRAS),
    "data": "text_files",
}  # fmt: skip
HF = {"project_name": "Ticket Triage", "extras": ["hf"], "data": "text_files"}
HF_SERVING = {"project_name": "Ticket Triage", "extras": ["hf", "serving"], "data": "text_files"}
CASES = {
    "core": (CORE, "zeta_vision", "zeta-vision"), "full": (FULL, "acme_imaging_experiments", "acme-research"),
    "hf": (HF, "ticket_triage", "ticket-triage"), "hf_serving": (HF_SERVING, "ticket_triage", "ticket-triage"),
}  # fmt: skip


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return commit_tree(ROOT, tmp_path_factory.mktemp("template"))


# -- the rules --------------------------------------------------------------------------------------------------


def test_strip_extra_blocks_drops_the_removed_blocks_and_keeps_the_others() -> None:
    inner = "# extra:serving\nboth\n# /extra:serving\n"
    text = f"a\n\n<!-- extra:search -->\n## Search\n{inner}<!-- /extra:search -->\n\nb\n"
    assert GENERATE.strip_extra_blocks(text, {"search"}) == "a\n\nb\n"
    assert GENERATE.strip_extra_blocks(text, {"serving"}) == text.replace(inner, "")
    assert GENERATE.strip_extra_blocks(text, set()) == text
    for broken in ("# extra:search\nx\n", "x\n# /extra:search\n", "# extra:search\n# /extra:serving\n"):
        with pytest.raises(ValueError):
            GENERATE.strip_extra_blocks(broken, set())


def test_every_marker_names_an_extra_or_a_pseudo_block_and_is_closed() -> None:
    tracked = git("ls-files", "--cached", "--others", "--exclude-standard", cwd=ROOT).splitlines()
    marked = [name for name in tracked if GENERATE.is_marked_kind(name) and (ROOT / name).is_file()]
    assert "Makefile" in marked and "pyproject.toml" in marked
    for name in marked:
        text = (ROOT / name).read_text()
        GENERATE.strip_extra_blocks(text, set())  # raises on an unbalanced marker
        blocks = EXTRAS.keys() | {GENERATE.TEMPLATE_BLOCK, GENERATE.EXTRAS_BLOCK}
        assert markers_in(text) <= blocks, f"{name}: a marker names neither an extra nor a pseudo-block"


def test_the_questions_match_the_manifest_and_the_generator() -> None:
    manifest = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["lightning_template"]["extras"]
    assert manifest == EXTRAS  # copier.yml's extra_paths (what Copier leaves out) and the project's own record
    assert sorted(QUESTIONS["extra_choices"]["default"].values()) == sorted(EXTRAS)
    assert sorted(QUESTIONS["data_choices"]["default"].values()) == sorted(GENERATE.DATA_CONFIGS)
    for config in GENERATE.DATA_CONFIGS.values():
        assert (ROOT / config).is_file(), config
        assert not any(GENERATE.under(config, paths) for paths in EXTRAS.values()), f"{config} is in an extra"
    assert set(GENERATE.TEMPLATE_ONLY) <= set(QUESTIONS["_exclude"])
    assert os.readlink(ROOT / "{{ package_name }}") == "lightning_template"  # the package, under its new name


# Names a user can type, and whether each makes a project (True) or is refused (the reason's words).
PROJECT_NAMES = {
    "Leaf Disease Classifier": True, '"Leaf" Net': True, "'Leaf' Net": True, "*Leaf*": True, "- Leaf": True,
    "Leaf: Net": True, "Leaf # Net": True, "123 Leaves": True, "[Leaf](x) <b> `a` | b & c {d}": True,
    "Léaf Nét": True, "": "empty", "   ": "empty", "torch": "library", "json": "library", "Tests": "library",
    "Leaf\\Net": "backslash", "Leaf\tNet": "control", "%%%": "distribution name", "Ünïcödé": True,
    "  Leaf   Disease  Classifier ": True,
}  # fmt: skip
PACKAGE_NAMES = {
    "leaf": True, "a" * 24: True, "leaf2": True, "": "Type one", "Leaf": "Lowercase", "2leaf": "Lowercase",
    "leaf-net": "Lowercase", "a" * 25: "24", "torch": "taken", "json": "taken", "class": "taken", "configs": "taken",
}  # fmt: skip


# Copier's Jinja as copier.yml's rules use it: their macros (.copier/rules.jinja) and Ansible's filters.
JINJA = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT), extensions=[AnsibleCoreFiltersExtension])


def slug_of(name: str) -> str:
    """copier.yml's project_slug for an ASCII name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def validator(question: str, **context) -> str:
    """copier.yml's validator of `question` rendered as Copier renders it while asking (its message, or "")."""
    conf = {"defaults": False, "data": {}}
    reserved = QUESTIONS["reserved_names"]["default"]
    return (
        JINJA.from_string(QUESTIONS[question]["validator"])
        .render(**context, reserved_names=reserved, _copier_conf=conf)
        .strip()
    )


@pytest.mark.parametrize("name", PROJECT_NAMES, ids=repr)
def test_a_project_name_gets_the_same_verdict_when_asked_and_when_given(name: str) -> None:
    """While it is typed (copier.yml's validator: a refusal asks again) and given by -d or --defaults (the
    generator, in one line): the same rule."""
    expected, reserved = PROJECT_NAMES[name], GENERATE.reserved_names(ROOT)
    asked = validator("project_name", project_name=name)
    slug = slug_of(name) if name.isascii() else "reseau"  # beyond ASCII: the package's name, typed
    try:
        GENERATE.check_project_name(name, slug, reserved)
        given = ""
    except SystemExit as refusal:
        given = str(refusal.code)
        assert given.startswith("generate: ") and "\n" not in given
    if expected is True:
        assert asked == given == ""
    else:
        assert expected in given, given
        assert asked, "the question accepts what the generator refuses"


@pytest.mark.parametrize("name", PACKAGE_NAMES, ids=repr)
def test_a_package_name_gets_the_same_verdict_when_asked_and_when_given(name: str) -> None:
    expected = PACKAGE_NAMES[name]
    asked = validator("package_name", package_name=name)
    try:
        GENERATE.check_package_name(name, GENERATE.reserved_names(ROOT))
        given = ""
    except SystemExit as refusal:
        given = str(refusal.code)
    assert (asked == given == "") if expected is True else (expected in asked and given), (asked, given)


@pytest.mark.parametrize(("package", "kept"), [("a", sorted(EXTRAS)), ("z" * 24, [])])
def test_the_package_renamed_and_the_blocks_dropped_need_no_formatter(package: str, kept, tmp_path: Path) -> None:
    """The shortest and the longest package names, every extra and none: the project's code keeps ruff's line
    breaks, blank lines and import order (the generator runs no formatter: Copier's Python has none)."""
    project = GENERATE.Project(package, package.replace("_", "-"), "X", frozenset(kept), "fashion_mnist", EXTRAS)
    tracked = git("ls-files", "--cached", "--others", "--exclude-standard", cwd=ROOT).splitlines()
    for path in GENERATE.template_files(ROOT, project, tracked):
        if path.endswith(".py") or path == "pyproject.toml":
            target = tmp_path / project.path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(GENERATE.project_text(path, (ROOT / path).read_text(), project))
    ruff = [sys.executable, "-m", "ruff"]
    for command in (["check", "--no-cache", "."], ["format", "--no-cache", "--check", "."]):
        done = subprocess.run([*ruff, *command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr


def test_no_comment_lines_up_after_the_package_name() -> None:
    """A project's package has its own name, longer or shorter: a comment aligned after the template's would stray."""
    tracked = git("ls-files", "--cached", "--others", "--exclude-standard", cwd=ROOT).splitlines()
    for name in tracked:
        text = text_of(ROOT / name) if (ROOT / name).is_file() else None
        for line in (text or "").splitlines():
            assert not re.search(r"lightning[_-]template\S*   +#", line), f"{name}: {line}"


# -- copier copy ------------------------------------------------------------------------------------------------


# What names an extra, beyond its paths: its make targets and dependency groups, its libraries and features, as the
# docs and comments would say them. A project without the extra has none of them in any file.
EXTRA_WORDS = {
    "search": ["make tune", "make seeds", "make test-search", "[tune]", "-tune", ".installed-tune", "Optuna", "optuna",
               "hyperparameter search", "tune.py", "multirun.py", "search extra", "searches"],
    "serving": ["make serve", "make bench-serve", "[serve]", "[export]", "-serve", "*.onnx", "/exports/",
                "schemathesis", "LitServe", "litserve", "ONNX", "onnx", "TorchScript", "serve.py", "export.py",
                "Docker", "serving", "HTTP API"],
    "streaming": ["[stream]", "LitData", "litdata", "streaming", "convert.py", "beyond RAM"],
    "benchmarks": ["make bench", "make bench-main", "make bench-quick", "make bench-scale", "make bench-gpu",
                   "benchmarks/"],
    "trackers": ["mlflow.yaml", "wandb.yaml", "tests/trackers", "/mlruns/", "/wandb/"],
    "tools": ["EMA", "SWA", "weight averaging", "LR finder", "learning-rate finder", "lr_find", "batch-size finder",
              "batch_size_finder", "tools extra"],
    "language_model": ["language model", "language_model", "LanguageModel", "5-gram", "n-gram", "bits per character",
                       "decoder-only"],
    "timm": ["TimmClassifier", "[timm]", "transfer-timm", "timm extra", "timm backbone"],
    "hf": ["HFClassifier", "HFTextDataModule", "[hf]", "hf extra", "installed-hf", "LoRA", "peft", "hf_models"],
}  # fmt: skip


def removed_mentions(removed: set[str]) -> set[str]:
    """What a project without these extras must not name: their files and folders (by path, and a script or page by
    its file name), make targets, dependency groups, libraries and features."""
    words = set()
    for extra in removed:
        for path in EXTRAS[extra]:
            if "." not in Path(path).name:  # a folder: by its path, with its slash (not the word "benchmarks")
                words.add(f"{path}/")
                if path.startswith("lightning_template/"):  # and a package: by its module's name
                    words.add(path.replace("/", "."))
                continue
            words.add(path)
            if not path.startswith("configs/presets/"):
                words.add(Path(path).name)
        words |= set(EXTRA_WORDS.get(extra, []))
    return words


def mentions_in(project: Path, removed: set[str]) -> dict[str, list[str]]:
    """{file: the words of removed extras it holds}, over every text file of the project."""
    words, package = removed_mentions(removed), yaml.safe_load((project / ".copier-answers.yml").read_text())
    words = {w.replace("lightning_template", package["package_name"]) for w in words}
    found = {}
    for path in project_files(project):
        if path.relative_to(project).parts[:2] == ("tests", "data"):  # real data samples: words of their own
            continue
        text = text_of(path)
        if text and GENERATE.EXTRAS_OFFERED in text:  # the README's list of the extras the project can add
            text = text[: text.index(GENERATE.EXTRAS_OFFERED)] + text[text.index("\n## Documentation\n") :]
        hits = sorted(w for w in words if text and re.search(rf"(?<![\w/.-]){re.escape(w)}(?![\w])", text))
        if hits:
            found[path.relative_to(project).as_posix()] = hits
    return found


def check_project(project: Path, answers: dict, package: str, slug: str) -> None:
    """What a project made with these answers has, and has not."""
    kept, removed = set(answers["extras"]), EXTRAS.keys() - set(answers["extras"])
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert recorded["package_name"] == package and sorted(recorded["extras"]) == sorted(kept)
    for path in project_files(project):
        name = path.relative_to(project).as_posix()
        assert "lightning_template" not in name
        text = text_of(path)
        if text is not None:
            assert not re.search("lightning[_-]template", text), f"{name} names the template's package"
            assert markers_in(text) <= kept | {"extras"}, f"{name} has markers of removed extras"
            assert "extra:template" not in text, f"{name} keeps the template's own words"
            assert not re.search(r"\.copier/|copier\.yml|tests/template|^\|.*\btemplate\b", text, flags=re.M), name
            assert not text or (text.endswith("\n") and not text.endswith("\n\n")), f"{name}: not one last newline"
    assert not mentions_in(project, removed), "files name what the project does not have"
    for path in {path for paths in EXTRAS.values() for path in paths}:  # of one extra, or of two (both kept)
        # benchmarks/serving.py is serving's, and the benchmarks' as a file of their folder
        present = not any(f"{path}/".startswith(f"{other}/") for extra in removed for other in EXTRAS[extra])
        assert (project / path.replace("lightning_template", package)).exists() is present, path
    for name in [*GENERATE.TEMPLATE_ONLY, "{{ _copier_conf.answers_file }}.jinja", "lightning_template"]:
        assert not (project / name).exists(), name
    assert (project / package / "engine" / "cli.py").is_file()

    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == slug
    groups = pyproject["project"]["optional-dependencies"]
    named = {g for line in groups["test"] if (m := re.fullmatch(r"[\w-]+\[(.*)\]", line)) for g in m[1].split(",")}
    assert named <= set(groups), f"the test group names a removed group: {named - set(groups)}"
    assert set(pyproject["tool"][package]["extras"]) == kept
    assert pyproject["tool"]["importlinter"]["root_package"] == package
    uv = Path(sys.executable).parent / "uv"  # the lock is the project's groups' (offline: no resolution needed)
    checked = subprocess.run([uv, "lock", "--check", "--offline"], cwd=project, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert checked.returncode == 0, checked.stderr

    makefile = (project / "Makefile").read_text()
    assert f"CONFIG ?= {GENERATE.DATA_CONFIGS[answers['data']]}\n" in makefile
    for target, extra in [("tune", "search"), ("seeds", "search"), ("serve", "serving"), ("bench", "benchmarks")]:
        assert bool(re.search(rf"^{target}:", makefile, flags=re.M)) is (extra in kept), target
    assert ("bench-serve:" in makefile) is ({"serving", "benchmarks"} <= kept)
    assert "\n\n\n" not in makefile


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_copy_writes_the_project_asked_for_and_lists_what_it_wrote(case: str, template: Path, tmp_path: Path) -> None:
    """`copier copy` as the README runs it: the files it lists are the project's, none written and then removed;
    nothing else is printed by the generator."""
    answers, package, slug = CASES[case]
    data = [f"--data={key}={json.dumps(value) if isinstance(value, list) else value}" for key, value in answers.items()]
    done = copier_cli("copy", "--trust", "--defaults", *data, str(template), "project", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    project = tmp_path / "project"
    check_project(project, answers, package, slug)
    printed = re.sub(r"\x1b\[[0-9;]*m", "", done.stderr).splitlines()
    listed = {line.split()[-1] for line in printed if line.split()[:1] == ["create"]}
    files = {p.relative_to(project).as_posix() for p in project_files(project)}
    assert files <= listed and not {p for p in listed - files if not (project / p).is_dir()}, listed ^ files
    assert "ruff" not in done.stderr and "generate:" not in done.stderr
    ruff = [sys.executable, "-m", "ruff"]
    for command in (["check", "--no-cache", "."], ["format", "--no-cache", "--check", "."]):
        checked = subprocess.run([*ruff, *command], cwd=project, capture_output=True, text=True, timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kept", [[], *([name] for name in sorted(EXTRAS)), sorted(EXTRAS)], ids=str)
def test_no_file_of_a_project_names_an_extra_it_does_not_have(kept: list[str], template: Path, tmp_path) -> None:
    """The core alone, each extra alone, all of them: no word of what the project lacks, in its docs, configs,
    Makefile, code, comments and docstrings."""
    project = make_project(template, tmp_path / "project", {"project_name": "Leaf Disease Classifier", "extras": kept})
    assert mentions_in(project, EXTRAS.keys() - set(kept)) == {}


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name, made in PROJECT_NAMES.items() if made is True], ids=repr)
def test_every_file_of_a_project_parses_whatever_its_name(name: str, template: Path, tmp_path: Path) -> None:
    answers = {"project_name": name, "extras": []} | ({} if name.isascii() else {"package_name": "leaf"})
    project = make_project(template, tmp_path / "project", answers)
    for path in project_files(project):
        text = text_of(path) or ""  # the data samples' gzipped files have none
        if path.suffix in (".yml", ".yaml"):
            yaml.safe_load(text)
        elif path.suffix == ".toml":
            tomllib.loads(text)
        elif path.suffix == ".py":
            ast.parse(text, str(path))
    written = " ".join(name.split())  # spaces around it and runs of them inside: one space, as a title reads
    assert yaml.safe_load((project / "mkdocs.yml").read_text())["site_name"] == written
    assert tomllib.loads((project / "pyproject.toml").read_text())["project"]["description"] == written
    title = (project / "README.md").read_text().splitlines()[0]
    assert title.startswith("# ") and re.sub(r"\\(.)", r"\1", title[2:]) == written  # Markdown's escapes aside


# Answers refused, the words of the reason, and the folder copied into: a new one, or one that exists.
REFUSED = [
    (["-d", "project_name=torch"], "distribution 'torch'", "existing"),
    (["-d", "project_name="], "name is empty", "new"),
    (["-d", "package_name=2leaf"], "starting with a letter", "new"),
    (["-d", "project_name=Réseau Neuronal"], "-d package_name=reseau_neuronal", "existing"),
    (["-d", "project_name=Plant Disease Classifiers"], "-d package_name=plant_disease_classifie", "new"),
    (["-d", 'extras=["serach", "tools"]'], """e.g. -d 'extras=["search", "tools"]'""", "existing"),
    (["-d", "data=mnist"], "e.g. -d data=fashion_mnist", "new"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("data", "reason", "folder"), REFUSED)
def test_a_name_given_on_the_command_line_is_refused_in_one_line_and_nothing_is_written(
    data, reason, folder: str, template: Path, tmp_path: Path
) -> None:
    """Refused before Copier writes a file: in a folder of the owner's (`mkdir leaf && copier copy ... leaf`)
    nothing is left, a new folder is not made, and no `create` line comes before the reason."""
    if folder == "existing":
        (tmp_path / "project").mkdir()
    done = copier_cli("copy", "--trust", "--defaults", *data, str(template), "project", cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("generate: ")]
    assert reason in line
    assert not [line for line in done.stderr.splitlines() if line.split()[:1] == ["create"]], done.stderr[-3000:]
    assert list(tmp_path.iterdir()) == ([tmp_path / "project"] if folder == "existing" else [])
    assert folder == "new" or not any((tmp_path / "project").iterdir())


@pytest.mark.slow
def test_the_readmes_command_line_answers_are_what_copier_takes(template: Path, tmp_path: Path) -> None:
    """The README's example of answers on the command line parses (the extras as a YAML list, even of one; none as
    []), and an extra given bare ends, as the README says, in Copier's own error: it reads the list before any rule of
    the template runs (the day Copier takes it, the README's words on it go)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    (example,) = re.findall(r"`(copier copy --trust --defaults -d [^`]*)`", readme)
    words = shlex.split(example.replace("<template>", str(template)))
    assert "extras=[search]" in words, example
    for answer in ("extras=[search]", "extras=[]"):
        given = [answer if word.startswith("extras=") else word for word in words]
        done = copier_cli(*given[1:], "--pretend", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    bare = [("extras=search" if word.startswith("extras=") else word) for word in words]
    done = copier_cli(*bare[1:], "--pretend", cwd=tmp_path)
    assert done.returncode != 0 and "TypeError: Not a YAML list: 'search'" in done.stderr, done.stderr[-3000:]
    assert "-d extras=search` ends in its traceback `Not a YAML list`" in readme


def test_answers_given_are_refused_before_writing_exactly_when_the_generator_refuses() -> None:
    """Given with -d or --defaults, the answers Copier writes nothing for (copier.yml's `refused`) are the answers
    the generator refuses: no project left half made, none refused that would work."""
    refused = JINJA.from_string(QUESTIONS["refused"]["default"])  # copier.yml's: why ("" when they can work)
    defaults = {name: QUESTIONS[name]["default"] for name in ("reserved_names", "extra_choices", "data_choices")}
    reserved = GENERATE.reserved_names(ROOT)
    for name, package in itertools.product(PROJECT_NAMES, ["", "leaf", "a" * 25, "torch"]):
        slug = slug_of(name) if name.isascii() else package.replace("_", "-")
        answers = {"project_name": name, "package_name": package, "project_slug": slug}
        verdict = refused.render(**defaults, **answers, extras=[], data="fashion_mnist").strip()
        try:
            GENERATE.check_project_name(name, slug, reserved)
            GENERATE.check_package_name(package, reserved)
            given = ""
        except SystemExit as refusal:
            given = str(refusal.code)
        assert bool(verdict) is bool(given), (name, package, verdict, given)


def python_3_10() -> str:
    """A Python 3.10 interpreter: on PATH, or one of pyenv's."""
    candidates = [shutil.which("python3.10"), *map(str, Path.home().glob(".pyenv/versions/3.10*/bin/python3.10"))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True, timeout=60).returncode == 0:
            return candidate
    pytest.fail("python3.10 is needed to check the generator on Copier's oldest Python (pyenv install 3.10)")


@pytest.mark.slow
def test_the_generator_runs_on_python_3_10(template: Path, tmp_path: Path) -> None:
    """Copier runs its tasks with its own Python, which may be the oldest it supports: the same project as with this
    one's, from the generator run by Python 3.10 (PyYAML's pure-Python modules on its path, no network)."""
    python310 = python_3_10()
    answers = {"project_name": "Leaf", "extras": ["tools"], "data": "text_files"}
    reference = make_project(template, tmp_path / "reference", answers)
    untouched = tmp_path / "untouched"
    make_project(template, untouched, answers, skip_tasks=True)
    site = tmp_path / "site"
    site.mkdir()
    (site / "yaml").symlink_to(Path(yaml.__file__).parent)
    command = [python310, str(template / ".copier/generate.py"), "--template", str(template), "--package", "leaf",
               "--slug", "leaf", "--extras", "tools", "--data", "text_files", "--name", "Leaf"]  # fmt: skip
    uv = str(Path(sys.executable).parent / "uv")  # the one Copier's run of the generator found beside its Python
    done = subprocess.run(command, cwd=untouched, env={**os.environ, "PYTHONPATH": str(site), "UV": uv},
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for path in project_files(reference):
        relative = path.relative_to(reference)
        assert (untouched / relative).read_bytes() == path.read_bytes(), relative


@pytest.mark.slow
def test_without_uv_the_generator_locks_the_project_with_its_own_make_lock(template: Path, tmp_path: Path) -> None:
    """Copier where only Python is (no uv on PATH or beside Copier's Python): the project's uv.lock is made by its
    own `make lock`, which puts uv into the project's venv as any `make` does (here the venv has this environment's
    uv, offline), so that the README's first commit holds the project's lock and its `make train` installs from it."""
    answers = {"project_name": "Leaf", "extras": []}
    project = make_project(template, tmp_path / "leaf", answers, skip_tasks=True)
    project_venv(project)
    python = Path(sys.base_prefix) / "bin" / "python3"  # this venv's interpreter, without the venv's uv beside it
    site = tmp_path / "site"
    site.mkdir()
    (site / "yaml").symlink_to(Path(yaml.__file__).parent)
    command = [python, template / ".copier/generate.py", "--template", template, "--package", "leaf", "--slug", "leaf",
               "--extras", "", "--data", "fashion_mnist", "--name", "Leaf"]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "UV_OFFLINE": "1", "HOME": os.environ["HOME"]}
    done = subprocess.run(list(map(str, command)), cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "make lock" not in done.stderr, done.stderr
    run([project / ".venv/bin/uv", "lock", "--check", "--offline"], project, {"UV_OFFLINE": "1"})


# -- a generated project on its own -------------------------------------------------------------------------------


def project_venv(project: Path) -> Path:
    """The project's own venv, with this environment's uv in it (the release the Makefile would put there): `make`
    installs the project's groups from its uv.lock, offline, out of uv's cache of this environment's install (the
    same wheels, linked rather than copied). Returns its python."""
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    (venv / "bin" / "uv").symlink_to(Path(sys.executable).parent / "uv")
    return venv / "bin" / "python"


def run(args: list, cwd: Path, env: dict | None = None, succeeds: bool = True) -> subprocess.CompletedProcess:
    """A command of the project, in a clean environment (no PYTHONPATH to the template, no outer make); it must
    succeed, or, with `succeeds=False`, fail."""
    outer = {"PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS"}  # e.g. the suite run by `make test-all`
    base = {k: v for k, v in os.environ.items() if k not in outer}
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )  # fmt: skip
    assert (done.returncode == 0) is succeeds, (
        f"{args} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


@pytest.mark.parametrize(("given", "installs_with"), [(None, "1"), ("", "1"), ("0", "0"), ("1", "1")])
def test_make_installs_compiled_unless_told_not_to(given: str | None, installs_with: str) -> None:
    """The UV_COMPILE_BYTECODE that make's installs see: 1 unless set to something (set but empty, uv would refuse
    every install)."""
    env = {k: v for k, v in os.environ.items() if k not in ("UV_COMPILE_BYTECODE", "MAKEFLAGS", "MAKELEVEL")}
    if given is not None:
        env["UV_COMPILE_BYTECODE"] = given
    show = 'include Makefile\nshow:\n\t@echo "$$UV_COMPILE_BYTECODE"\n'
    done = subprocess.run(["make", "-s", "-f", "-", "show"], input=show, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert done.stdout == f"{installs_with}\n"


@pytest.mark.slow
def test_a_lock_that_no_longer_matches_pyproject_stops_make_before_installing(template: Path, tmp_path: Path) -> None:
    """A dependency added to pyproject.toml without `make lock`: `make train` stops at the check of the lock, saying
    how to update it, with nothing installed; `make lock` (offline here: a package the lock already holds, so uv's
    cache has its metadata) makes it match again."""
    project = make_project(template, tmp_path / "project", {"project_name": "Leaf", "extras": []})
    python = project_venv(project)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('    "rich>=13",\n', '    "rich>=13",\n    "hypothesis>=6.100",\n')
    )
    env = {"UV_OFFLINE": "1"}
    done = run(["make", "train"], project, env, succeeds=False)
    assert "needs to be updated, but `--locked` was provided" in " ".join(done.stderr.split()), done.stderr  # wrapped
    assert not list((project / ".venv").glob("lib/python*/site-packages/torch")), "installed from a stale lock"
    run(["make", "lock"], project, env)
    run([python.parent / "uv", "lock", "--check", "--offline"], project, env)


@pytest.mark.slow
# The core project, the hf extra's alone and with serving in every run; the one with every extra (its tests are the
# template's own) in `make matrix`.
@pytest.mark.parametrize("case", ["core", "hf", "hf_serving", pytest.param("full", marks=pytest.mark.matrix)])
def test_a_generated_project_installs_lints_and_passes_its_tests(case: str, template: Path, tmp_path: Path) -> None:
    """The project's own `make` targets, as its README says to run them: `make test`, `make lint`, `make docs`,
    `make hooks` and a commit through its hooks without the venv activated, `make train` (short). Its venv gets
    what its own uv.lock holds (`--locked`: a lock that does not match its groups fails here). Its `make test` runs
    without Debian's data packages where the machine can hide them, on the samples the project ships."""
    answers, package, slug = CASES[case]
    project = make_project(template, tmp_path / "project", answers)
    python = project_venv(project)
    git("init", "-q", "-b", "main", cwd=project)
    git("add", "-A", cwd=project)
    plain_path = os.environ["PATH"]  # not the venv's bin: nothing activated
    env = {"PRE_COMMIT_HOME": str(tmp_path / "pre-commit"), "PATH": plain_path, "UV_OFFLINE": "1", **GIT_IDENTITY}

    start = time.monotonic()
    done = run([*without_system_data(), "make", "test"], project, env)
    test_seconds = time.monotonic() - start
    assert f" + {slug}==0.1.0 (from file://" in done.stderr, done.stderr[-2000:]  # the project, editable, locked
    summary = [line for line in done.stdout.splitlines() if " passed" in line][-1]
    assert " failed" not in summary and " error" not in summary, summary
    print(f"\n{case}: make test took {test_seconds:.0f} s ({summary.strip('= ')})")
    where = f"import importlib.util as u, {package}; print({package}.__file__, u.find_spec('lightning_template'))"
    located = run([python, "-I", "-c", where], tmp_path).stdout.split()
    assert Path(located[0]).is_relative_to(project) and located[1] == "None", located
    run(["make", "lint"], project, env)  # ruff check, ruff format --check, lint-imports
    run(["make", "docs"], project, env)
    run(["make", "hooks"], project, env)
    (project / "notes.py").write_text("x  =  1\n")  # the hooks reformat it: the first commit stops, the second passes
    git("add", "notes.py", cwd=project)
    first = subprocess.run(["git", "commit", "-qm", "notes"], cwd=project, env={**os.environ, **env},
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert first.returncode != 0 and "ruff format" in first.stdout + first.stderr, first.stdout + first.stderr
    assert "not found" not in first.stdout + first.stderr and (project / "notes.py").read_text() == "x = 1\n"
    git("add", "notes.py", cwd=project)
    run(["git", "commit", "-qm", "notes"], project, env)
    if case == "core":
        short = "--trainer.max_epochs=1 --trainer.limit_train_batches=3 --trainer.limit_val_batches=2"
        run(["make", "train", f"ARGS={short} --test_after_fit=false"], project, env)
        assert (project / "logs/simple_cnn/version_0/checkpoints/last.ckpt").is_file()
