"""What a new owner reads in a project made from the template, and what its own tests ask of them: the README
written for the data `make train` starts with and for the extras the project has (and those it can add), the
template's releases as the copy and the update find them, and no test of the project failed by an edit of a file
the README calls theirs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.template.projects import (
    GENERATE,
    GIT_IDENTITY,
    QUESTIONS,
    SUBPROCESS_TIMEOUT,
    commit_tree,
    copier_cli,
    git,
    make_project,
)
from tests.test_docs import broken_links

CORE = {"project_name": "Leaf", "extras": []}
# Of each choice of data: the job's logs folder, and a folder its README's **Data.** paragraph names.
DATA_WORDS = {"image_folders": ("logs/resnet_finetune/", "data/images/train/"),
              "text_files": ("logs/transformer_text/", "data/fortunes/")}  # fmt: skip
# The README's sample run and data paragraph of the template's main job (Fashion-MNIST).
FASHION_MNIST_WORDS = ("logs/simple_cnn/", "test accuracy: 0.", "Fashion-MNIST is looked for")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return commit_tree(ROOT, tmp_path_factory.mktemp("template"))


@pytest.mark.slow
@pytest.mark.parametrize("data", sorted(DATA_WORDS))
def test_the_readme_shows_the_run_and_the_data_of_the_job_make_train_runs(data: str, template: Path, tmp_path) -> None:
    project = make_project(template, tmp_path / "project", {**CORE, "data": data})
    readme = (project / "README.md").read_text()
    assert not [words for words in FASHION_MNIST_WORDS if words in readme]
    assert all(words in readme for words in DATA_WORDS[data]), DATA_WORDS[data]
    assert broken_links(project / "README.md") == []


@pytest.mark.slow
def test_a_project_without_every_extra_names_those_it_can_add_and_how(template: Path, tmp_path: Path) -> None:
    project = make_project(template, tmp_path / "project", {**CORE, "extras": ["tools"]})
    readme = (project / "README.md").read_text()
    offered = readme[readme.index(GENERATE.EXTRAS_OFFERED) : readme.index("\n## Documentation\n")]
    for label, name in QUESTIONS["extra_choices"]["default"].items():
        assert (label in offered) is (name != "tools"), label
    (command,) = re.findall(r"^copier update --trust --defaults -d 'extras=(\[.*\])'$", offered, flags=re.M)
    named = yaml.safe_load(command)
    assert "tools" in named and set(named) <= set(QUESTIONS["extra_choices"]["default"].values()), named


def project_pytest(project: Path, *tests: str) -> subprocess.CompletedProcess:
    """The project's fast tests named, as `make test` runs them (its package from its own folder)."""
    outer = {"PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS"}
    env = {**{k: v for k, v in os.environ.items() if k not in outer}, "PYTHONPATH": str(project)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not slow and not matrix", *tests]
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)


def release(template: Path, version: str) -> None:
    """The README's release step: `version` set in pyproject.toml, committed, tagged `v` and the version."""
    pyproject = template / "pyproject.toml"
    pyproject.write_text(re.sub(r'(?m)^version = ".*"$', f'version = "{version}"', pyproject.read_text(), count=1))
    git("commit", "-q", "--allow-empty", "-am", f"Release {version}", cwd=template)
    git("tag", f"v{version}", cwd=template)


@pytest.mark.slow
@pytest.mark.matrix  # nightly: the slowest checks
def test_copies_and_updates_take_the_newest_release_tag(tmp_path: Path) -> None:
    """The release step the README documents gives the version Copier records, at a copy and at the update after
    the next release (no --vcs-ref: the README's commands as written)."""
    readme = (ROOT / "README.md").read_text()
    step = re.search(r"`git tag v([\w.]+) && git push origin main v([\w.]+)`", readme)
    assert step and step[1] == step[2], "README.md: the release step, `git tag vX.Y.Z && git push origin main vX.Y.Z`"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    template = commit_tree(ROOT, tmp_path / "template")
    release(template, version)
    done = copier_cli("copy", "--trust", "--defaults", "-d", "project_name=Leaf", "-d", "extras=[]", str(template),
                      "project", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0 and "No git tags found" not in done.stderr, done.stderr[-3000:]
    project = tmp_path / "project"
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == f"v{version}"
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "From the template"]):
        git(*args, cwd=project)

    major, minor, patch = (int(part) for part in version.split(".")[:3])
    (template / "docs/index.md").write_text((template / "docs/index.md").read_text() + "\nA release's change.\n")
    release(template, f"{major}.{minor}.{patch + 1}")
    done = copier_cli("update", "--trust", "--defaults", cwd=project, env=GIT_IDENTITY)
    assert done.returncode == 0 and "No git tags found" not in done.stderr, done.stderr[-3000:]
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == f"v{major}.{minor}.{patch + 1}"
    assert (project / "docs/index.md").read_text().endswith("\nA release's change.\n")


# Tests of a project that met warnings raised by its libraries' deprecations and by its own code, and their words.
WARNED = {"tests/test_any_task.py::test_a_plain_task_stopped_by_sigterm_resumes_exactly": "was deprecated",
          "tests/streaming/test_streaming.py::test_image_files_round_trip": "is not writable"}  # fmt: skip


@pytest.fixture(scope="module")
def owners_tests(template: Path, tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """The fast tests of a project's docs and of its warned code, run once after the owner set the main job's
    epochs (configs/ is theirs, the README says)."""
    project = make_project(template, tmp_path_factory.mktemp("owned") / "project", {**CORE, "extras": ["streaming"]})
    job = project / "configs/simple_cnn.yaml"
    job.write_text(re.sub(r"(?m)^(\s*max_epochs:) \d+", r"\1 2", job.read_text()))
    assert "max_epochs: 2" in job.read_text()
    return project_pytest(project, "-rA", "tests/test_docs.py", *WARNED)


def outcomes(run: subprocess.CompletedProcess, prefix: str) -> set[str]:
    """PASSED, FAILED, ... of the tests whose id starts with `prefix`."""
    rows = [line.split() for line in run.stdout.splitlines()]
    return {row[0] for row in rows if len(row) > 1 and row[0].isupper() and row[1].startswith(prefix)}


@pytest.mark.slow
def test_the_owners_edit_of_the_main_job_fails_none_of_the_projects_docs_tests(owners_tests) -> None:
    assert outcomes(owners_tests, "tests/test_docs.py") == {"PASSED"}, owners_tests.stdout[-3000:]


@pytest.mark.slow
def test_a_projects_tests_show_no_warning_of_a_library_deprecation_or_of_its_own_code(owners_tests) -> None:
    for test, words in WARNED.items():
        assert outcomes(owners_tests, test) == {"PASSED"}, owners_tests.stdout[-3000:]
        assert words not in owners_tests.stdout, owners_tests.stdout[-3000:]
