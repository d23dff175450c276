"""`copier copy` in a terminal, as the README's first command runs it: a person reads each question and types.

Copier checks a computed default before it asks: a project's name whose package name cannot be guessed (too long,
no ASCII letters) gets the question with no guess, and what is typed there is checked as it is typed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.template.projects import commit_tree, copier_in_terminal

CLEAR = "\x15"  # Ctrl-U: the line's text (the question's default) erased, as a person replaces it
ENTER = "\r"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return commit_tree(ROOT, tmp_path_factory.mktemp("template"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "typed", "package"),
    [
        ("Plant Disease Classifiers", ["plant_disease"], "plant_disease"),  # its guess would be 25 characters
        ("叶子网络", ["2leaf", "leaf_net"], "leaf_net"),  # no guess at all; a refused package name asked again
    ],
)
def test_a_name_without_a_package_guess_gets_the_question(name, typed, package, template: Path, tmp_path) -> None:
    replies = [("project's name", CLEAR + name + ENTER), ("Python package", typed[0] + ENTER)]
    replies += [("Validation error", CLEAR + again + ENTER) for again in typed[1:]]
    replies += [("extras", "a" + ENTER), ("data", ENTER)]  # `a` unticks every extra: the core alone
    status, screen = copier_in_terminal(["copy", "--trust", str(template), "project"], replies, cwd=tmp_path)
    assert status == 0 and "Traceback" not in screen, screen[-3000:]
    answers = yaml.safe_load((tmp_path / "project" / ".copier-answers.yml").read_text())
    assert (answers["project_name"], answers["package_name"], answers["extras"]) == (name, package, [])
    assert (tmp_path / "project" / package / "engine" / "cli.py").is_file()
