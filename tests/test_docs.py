"""The documentation: the site builds with `mkdocs build --strict` (a broken link or anchor fails it), also as a
project without any extra, and every relative link of README.md leads to a file, and a heading, that exist.

A block of README.md, docs/*.md or mkdocs.yml that belongs to an extra sits between marker lines,
`<!-- extra:NAME -->` ... `<!-- /extra:NAME -->` (Markdown) or `# extra:NAME` ... `# /extra:NAME` (YAML);
a project without that extra has neither the block nor the extra's pages ([tool.lightning_template.extras]).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.extra_markers import marker, strip_extra_blocks

MAX_README_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DOC_FILES = ("README.md", "mkdocs.yml")  # and everything under docs/


def extras_manifest(root: Path) -> dict[str, list[str]]:
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["lightning_template"].get("extras", {})


def doc_paths(root: Path) -> list[Path]:
    return [root / name for name in DOC_FILES] + sorted((root / "docs").rglob("*.md"))


def marked_extras(root: Path) -> set[str]:
    names = set()
    for path in doc_paths(root):
        for line in path.read_text().splitlines():
            if found := marker(line):
                names.add(found[1])
    return names


def docs_copy(tmp_path: Path, removed: set[str]) -> Path:
    """README.md, mkdocs.yml and docs/ in a fresh folder, without the removed extras' blocks and pages."""
    copy = tmp_path / "project"
    shutil.copytree(ROOT / "docs", copy / "docs")
    for name in DOC_FILES:
        shutil.copy2(ROOT / name, copy / name)
    for path in doc_paths(copy):
        path.write_text(strip_extra_blocks(path.read_text(), removed))
    for name in removed:
        for path in extras_manifest(ROOT).get(name, []):
            if path.startswith("docs/"):
                (copy / path).unlink()
    return copy


def build_site(project: Path, site: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(project / "mkdocs.yml")]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [*command, "--site-dir", str(site)], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )  # fmt: skip


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (but `-`), each space a `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def without_fences(markdown: str) -> str:
    return re.sub(r"^```.*?^```[^\n]*$", "", markdown, flags=re.M | re.S)


def without_code(markdown: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", without_fences(markdown))


def anchors(markdown: str) -> Iterator[str]:
    """The anchors GitHub gives the headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", without_fences(markdown), flags=re.M):
        slug = github_slug(heading)
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def broken_links(readme: Path) -> list[str]:
    """The relative links of a Markdown file whose file, or heading in it, does not exist."""
    broken = []
    for target in LINK.findall(without_code(readme.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        linked = (readme.parent / path).resolve() if path else readme
        if not linked.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and (linked.suffix != ".md" or anchor not in set(anchors(linked.read_text()))):
            broken.append(f"{target}: no heading #{anchor} in {path or readme.name}")
    return broken


@pytest.mark.slow
def test_the_site_builds_with_strict_checks_of_links_and_anchors(tmp_path: Path) -> None:
    done = build_site(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()


@pytest.mark.slow
def test_the_site_of_a_project_without_any_extra_builds(tmp_path: Path) -> None:
    removed = marked_extras(ROOT) | set(extras_manifest(ROOT))
    copy = docs_copy(tmp_path, removed)
    assert marked_extras(copy) == set()
    done = build_site(copy, tmp_path / "site")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert broken_links(copy / "README.md") == []


def test_every_relative_link_of_the_readme_resolves() -> None:
    assert broken_links(ROOT / "README.md") == []


def test_the_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


def test_every_extra_page_is_in_the_manifest_and_every_block_names_an_extra() -> None:
    manifest = extras_manifest(ROOT)
    # and the two blocks of the generator: the template's own words, the words about extras
    assert marked_extras(ROOT) <= set(manifest) | {"template", "extras"}
    for name, paths in manifest.items():
        for path in paths:
            if path.startswith("docs/"):
                assert (ROOT / path).is_file(), f"{name}: {path}"


def test_strip_extra_blocks() -> None:
    text = "a\n<!-- extra:search -->\nb\n  # extra:tools\nc\n  # /extra:tools\n<!-- /extra:search -->\nd\n"
    assert strip_extra_blocks(text, {"search"}) == "a\nd\n"
    assert strip_extra_blocks(text, {"tools"}) == "a\n<!-- extra:search -->\nb\n<!-- /extra:search -->\nd\n"
    assert strip_extra_blocks(text, set()) == text
    for unbalanced in ("<!-- extra:search -->\nb\n", "b\n# /extra:search\n", "# extra:a\n# /extra:b\n"):
        with pytest.raises(ValueError):
            strip_extra_blocks(unbalanced, {"search"})


def test_no_marker_sits_in_a_code_block_where_the_site_would_show_it() -> None:
    for path in doc_paths(ROOT):
        fenced = False
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            fenced ^= line.lstrip().startswith("```")
            assert not (fenced and marker(line)), f"{path.relative_to(ROOT)}:{number}: a marker inside a code block"


# extra:template
# What the template's pages quote of its main job, checked against the job: a project's configs and pages are its
# owner's to change (these tests are not in a project made from the template).
CHECKPOINT_NAME = re.compile(r"logs/(\w+)/version_\d+/checkpoints/(epoch=(\d+)-\w+=[\d.]+\.ckpt)")


def test_the_main_job_quoted_in_the_docs_is_the_config_file() -> None:
    job = (ROOT / "configs/simple_cnn.yaml").read_text().splitlines()
    body = "\n".join(re.sub(r"\s+#.*$", "", line) for line in job if not line.startswith("#")).strip()
    assert f"```yaml\n{body}\n```" in (ROOT / "docs/configs.md").read_text(), (
        "docs/configs.md's yaml block is not configs/simple_cnn.yaml: copy the file there (its comments left out)"
    )


def test_every_quoted_checkpoint_name_counts_epochs_from_1_within_its_job() -> None:
    """The best epoch's checkpoint is named after its epoch counted from 1, as the console counts them: the rule is
    stated where checkpoints are described, and every name the pages quote is one its job can write, the main
    job's the one of the README's sample run."""
    assert "epoch counted from 1" in (ROOT / "docs/reliability.md").read_text()
    (sample,) = re.findall(r"^best checkpoint: (\S+)", (ROOT / "README.md").read_text(), flags=re.M)
    for path in doc_paths(ROOT):
        for quoted in CHECKPOINT_NAME.finditer(path.read_text()):
            job, name, epoch = quoted[1], quoted[2], int(quoted[3])
            configs = [(ROOT / "configs" / f"{config}.yaml").read_text() for config in (job, "defaults")]
            epochs = int(next(m[1] for text in configs if (m := re.search(r"(?m)^  max_epochs: (\d+)", text))))
            where = f"{path.relative_to(ROOT)}: {name}"
            assert 1 <= epoch <= epochs, f"{where}: epoch {epoch} of a {epochs}-epoch job (counted from 1)"
            assert job != "simple_cnn" or quoted[0] == sample, f"{where}: not the README's sample run ({sample})"


def test_the_readme_says_where_its_python_commands_run_before_it_shows_one() -> None:
    """`python train.py ...` works in a fresh shell only in the venv `make train` made: the README says so first."""
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"(?<![\w/])python [\w/]+\.py ", readme)
    assert first and "source .venv/bin/activate" in readme[: first.start()], "README.md: activate the venv first"


# /extra:template
