"""`copier update`, as a project's README runs it: the template's changes merged with the owner's, an extra removed
without losing what the owner made of it, and conflicts said with the way to finish."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.template.projects import (
    GIT_IDENTITY,
    commit_tree,
    committed_project,
    copier_cli,
    git,
    project_files,
    text_of,
)


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """A clone of the template that each test changes as a template's author would."""
    return commit_tree(ROOT, tmp_path / "template")


def update(project: Path, *data: str) -> tuple[int, str]:
    """The README's `copier update --trust --defaults [-d ...]` from the template's newest commit: (status, output)."""
    done = copier_cli("update", "--trust", "--defaults", "--vcs-ref=HEAD", *data, cwd=project)
    return done.returncode, done.stdout + done.stderr


def commit_all(repo: Path, message: str) -> None:
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)


@pytest.mark.slow
def test_update_brings_the_template_change_and_keeps_the_owners(template: Path, tmp_path: Path, monkeypatch) -> None:
    for key, value in GIT_IDENTITY.items():
        monkeypatch.setenv(key, value)  # Copier's own commits
    project = committed_project(template, tmp_path / "project", {"project_name": "Update Demo", "extras": ["tools"]})
    package = project / "update_demo"
    ignored = project / "logs" / "notes.md"  # the owner's, ignored: never touched by the generator
    ignored.parent.mkdir()
    ignored.write_text("lightning_template\n<!-- extra:search -->\n")

    # The template improves: a core module, the Makefile, and an extra this project left out.
    core = template / "lightning_template/tasks/classification/models/simple_cnn.py"
    core.write_text(core.read_text() + '\n\nTEMPLATE_CHANGE = "lightning_template"\n')
    makefile = template / "Makefile"
    makefile.write_text(
        makefile.read_text().replace(
            "test-all: $(VENV)/.installed-test\n", "test-all: $(VENV)/.installed-test  # template change\n"
        )
    )
    serving = template / "lightning_template/serving/api.py"
    serving.write_text(serving.read_text() + "\nSERVING_CHANGE = 1\n")
    commit_all(template, "template change")

    # The owner edits the same core module elsewhere, and adds a module.
    mine = package / "tasks/classification/models/simple_cnn.py"
    mine.write_text(mine.read_text().replace("SimpleCNN: the classic", "SimpleCNN (the owner's edit): the classic", 1))
    (package / "tasks/classification/models/mine.py").write_text('"""The owner\'s own module."""\n')
    commit_all(project, "the owner's edit")

    status, output = update(project)
    assert status == 0, output[-3000:]
    updated = mine.read_text()
    assert 'TEMPLATE_CHANGE = "update_demo"' in updated  # the template's change, renamed like the rest
    assert "SimpleCNN (the owner's edit): the classic" in updated
    assert "test-all: $(VENV)/.installed-test  # template change\n" in (project / "Makefile").read_text()
    assert (package / "tasks/classification/models/mine.py").is_file()
    assert not (project / "lightning_template").exists() and not (package / "serving").exists()
    assert ignored.read_text() == "lightning_template\n<!-- extra:search -->\n"
    changed = sorted(line[3:] for line in git("status", "--porcelain", cwd=project).splitlines())
    assert changed == [".copier-answers.yml", "Makefile", "update_demo/tasks/classification/models/simple_cnn.py"], (
        changed
    )
    for path in project_files(project):
        text = text_of(path) if ".git" not in path.parts and "logs" not in path.parts else None
        assert text is None or ("lightning_template" not in text and not re.search("^<<<<<<< ", text, re.M)), path
    assert "conflict" not in output


@pytest.mark.slow
def test_removing_an_extra_the_owner_made_theirs_is_refused_until_they_decide(template: Path, tmp_path: Path) -> None:
    """The owner edited the language model and its config, and added a module to its package: removing the extra
    changes nothing and names the three files. Moved out (the new module) and the rest deleted by the owner, the
    same update removes the extra, leaving no orphan."""
    answers = {"project_name": "Leaf", "extras": ["language_model", "tools"]}
    project = committed_project(template, tmp_path / "project", answers)
    model, config = project / "leaf/tasks/language_model/model.py", project / "configs/language_model.yaml"
    model.write_text(model.read_text().replace("LN2 = math.log(2)", "LN2 = math.log(2)  # the owner's"))
    config.write_text(config.read_text().replace("dim: 128", "dim: 256"))
    sampler = project / "leaf/tasks/language_model/my_sampler.py"
    sampler.write_text('"""The owner\'s sampler."""\n')
    commit_all(project, "the owner's language model")
    before = {p: p.read_bytes() for p in project_files(project) if ".git" not in p.parts}

    status, output = update(project, "-d", "extras=[tools]")
    assert status != 0
    for path in (
        "leaf/tasks/language_model/model.py",
        "configs/language_model.yaml",
        "leaf/tasks/language_model/my_sampler.py",
    ):
        assert f"  {path}\n" in output, output[-3000:]
    assert "Nothing was changed" in output and "git rm" in output
    assert git("status", "--porcelain", cwd=project) == ""  # the project is as it was: every file, every byte
    assert {p: p.read_bytes() for p in project_files(project) if ".git" not in p.parts} == before

    # The owner decides: keeps their sampler elsewhere, lets the rest go.
    git("mv", "leaf/tasks/language_model/my_sampler.py", "leaf/my_sampler.py", cwd=project)
    git("rm", "-q", "leaf/tasks/language_model/model.py", "configs/language_model.yaml", cwd=project)
    commit_all(project, "the owner keeps their sampler")
    status, output = update(project, "-d", "extras=[tools]")
    assert status == 0, output[-3000:]
    assert not (project / "leaf/tasks/language_model").exists() and not (project / "tests/language_model").exists()
    assert (project / "leaf/my_sampler.py").is_file() and (project / "leaf/tools").is_dir()
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert recorded["extras"] == ["tools"]


@pytest.mark.slow
def test_removing_an_extra_the_owner_left_alone_removes_it(template: Path, tmp_path: Path) -> None:
    project = committed_project(template, tmp_path / "project", {"project_name": "Leaf", "extras": ["serving"]})
    status, output = update(project, "-d", "extras=[]")
    assert status == 0, output[-3000:]
    assert "copier update: removed the extras serving (`git status` lists their files)." in output
    for path in ("serve.py", "export.py", "leaf/serving", "tests/serving", "docs/serving.md", "Dockerfile"):
        assert not (project / path).exists(), path
    assert "make serve" not in (project / "Makefile").read_text()


@pytest.mark.slow
def test_an_update_that_swaps_extras_leaves_a_lock_of_the_projects_new_groups(template: Path, tmp_path: Path) -> None:
    """uv.lock follows the extras: serving's packages leave it, timm's come in, and `make`'s `uv sync --locked` would
    accept it (uv's own check, offline)."""
    project = committed_project(template, tmp_path / "project", {"project_name": "Leaf", "extras": ["serving"]})
    assert 'name = "litserve"' in (project / "uv.lock").read_text()
    status, output = update(project, "-d", "extras=[timm]")
    assert status == 0, output[-3000:]
    locked = (project / "uv.lock").read_text()
    assert 'name = "timm"' in locked and 'name = "litserve"' not in locked
    uv = Path(sys.executable).parent / "uv"
    checked = subprocess.run([uv, "lock", "--check", "--offline"], cwd=project, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert " uv.lock" in git("status", "--porcelain", cwd=project) and "uv.lock still holds" not in output


@pytest.mark.slow
def test_the_hf_extra_is_added_and_removed_with_its_packages(template: Path, tmp_path: Path) -> None:
    project = committed_project(template, tmp_path / "project", {"project_name": "Leaf", "extras": []})
    assert 'name = "transformers"' not in (project / "uv.lock").read_text()
    status, output = update(project, "-d", "extras=[hf]")
    assert status == 0, output[-3000:]
    for path in ("leaf/hf_models/model.py", "tests/hf_models/test_hf.py", "configs/hf_fortunes.yaml"):
        assert (project / path).is_file(), path
    assert 'name = "peft"' in (project / "uv.lock").read_text() and "hf_fortunes" in (project / "Makefile").read_text()
    commit_all(project, "the hf extra")
    status, output = update(project, "-d", "extras=[]")
    assert status == 0, output[-3000:]
    assert not (project / "leaf/hf_models").exists() and not (project / "tests/hf_models").exists()
    assert 'name = "peft"' not in (project / "uv.lock").read_text() and "hf_" not in (project / "Makefile").read_text()


@pytest.mark.slow
def test_a_line_changed_by_both_the_owner_and_the_template_is_named_with_the_way_to_finish(
    template: Path, tmp_path: Path
) -> None:
    project = committed_project(template, tmp_path / "project", {"project_name": "Leaf", "extras": []})
    for folder, value in ((template, "0.0101"), (project, "0.0102")):
        job = folder / "configs/simple_cnn.yaml"
        job.write_text(re.sub(r"lr: [0-9.e-]+", f"lr: {value}", job.read_text(), count=1))
    commit_all(template, "a faster learning rate")
    commit_all(project, "the owner's learning rate")

    status, output = update(project)
    assert status == 0, output[-3000:]
    assert "1 file has lines that you and the template both changed:\n  configs/simple_cnn.yaml\n" in output
    assert "`git add` the files and commit" in output
    assert "UU configs/simple_cnn.yaml" in git("status", "--porcelain", cwd=project)
    text = (project / "configs/simple_cnn.yaml").read_text()
    assert "<<<<<<< before updating" in text and "lr: 0.0102" in text and "lr: 0.0101" in text
