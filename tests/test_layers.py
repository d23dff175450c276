"""The core stands alone: it runs with every extra unimportable, and removing extras leaves a working project.

What an extra is (its paths) is stated once, in pyproject.toml's [tool.lightning_template.extras]; the rule that
removes one (its paths, its entries, its marked blocks) is the template's generator's, .copier/generate.py, which
makes new projects with copier.yml: the core-only project made by it installs and passes its own fast tests
(tests/test_copier.py).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.conftest import QUICK, ROOT

GENERATOR = ROOT / ".copier" / "generate.py"  # the template's, not in a project made from it

EXTRAS: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["lightning_template"][
    "extras"
]
# The extras' packages and the third-party libraries only they use.
EXTRA_MODULES = [
    *(f"lightning_template.{name}" for name in ("search", "serving", "streaming", "tools")),
    *("optuna", "litserve", "litdata", "onnx", "onnxruntime", "mlflow", "wandb"),
]


@pytest.mark.slow
def test_the_core_trains_with_every_extra_unimportable(tmp_path: Path) -> None:
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in EXTRA_MODULES)  # `import` of it fails
    code = f"import sys; {blocked}; from lightning_template.engine.cli import main; main()"
    args = ["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), *QUICK, "--trainer.max_epochs=1"]
    args += ["--trainer.limit_train_batches=3", "--test_after_fit=true"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "test accuracy:" in done.stdout
    assert (tmp_path / "logs/simple_cnn/version_0/checkpoints/last.ckpt").is_file()


def test_every_path_of_an_extra_exists() -> None:
    for name, paths in EXTRAS.items():
        for path in paths:
            assert (ROOT / path).exists(), f"[tool.lightning_template.extras] {name}: {path} does not exist"


def generator():
    """.copier/generate.py as a module (a plain script, outside the package)."""
    if not GENERATOR.is_file():
        pytest.skip("removing extras is the template's test: a project made from it has no .copier/generate.py")
    spec = importlib.util.spec_from_file_location("copier_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def project_without(tmp_path: Path, removed: list[str]) -> Path:
    """A copy of the project's tracked files, less the template's own files and the given extras: their paths,
    their entries in pyproject.toml and their marked blocks (the generator's rule; README.md, mkdocs.yml, docs/
    too)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    copy = tmp_path / "project"
    rule = generator()
    for name in tracked.splitlines():
        if (ROOT / name).is_file() and not rule.under(name, rule.TEMPLATE_ONLY):
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    rule.remove_extras(copy, removed)
    return copy


# The editable install of this project resolves a submodule missing from the copy (a removed extra) to this
# checkout's: every Python process of the copy's tests drops that finder at start-up.
SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not str(getattr(f, "__module__", "")).startswith("__editable__")]
"""


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    shim = project.parent / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{project}"}  # the copy's package, not the installed one
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_removing_one_extra_leaves_every_other_test_importable(extra: str, tmp_path: Path) -> None:
    done = run_pytest(project_without(tmp_path, [extra]), "--collect-only", "-m", "not slow or slow")
    assert done.returncode == 0, done.stdout[-3000:]
