"""The same job over several seeds or k folds, each an ordinary train.py run, summarised as mean ± std.

Runs go to `logs/multirun/<name>/{seed_42,fold_0,...}/` (with MLflow or W&B, to the tracker, named
so). A finished run leaves `result.json` there and is not run again; an interrupted one is resumed
from its last.ckpt (exact resume) in the same tracker run, so rerunning the same command after a
stop finishes the set. Both files hold the run's resolved settings: a rerun whose flags or config
contents resolve otherwise is refused, naming what changed, before anything runs.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lightning_template.engine.errors import ConfigError
from lightning_template.search import runs


def variants(seeds: list[int] | None, folds: int | None) -> list[tuple[str, dict[str, int]]]:
    """(run folder, the values it sets) for each seed or each fold."""
    if folds is not None:
        if folds < 2:
            raise ConfigError(f"--folds {folds}: k-fold needs at least 2 folds.")
        return [(f"fold_{i}", {"data.num_folds": folds, "data.fold": i}) for i in range(folds)]
    return [(f"seed_{s}", {"seed_everything": s}) for s in seeds or []]


def run_all(
    base: runs.RunConfig, name: str, seeds: list[int] | None, folds: int | None
) -> tuple[list[dict[str, Any]], Path]:
    """Every run's result (running what is not done yet), and the folder that holds them."""
    out = Path("logs") / "multirun" / name
    base.check_single_process("multirun.py")
    todo = []
    for folder, values in variants(seeds, folds):
        config = base.with_values(values)
        todo.append((folder, config, config.settings()))
    for folder, _, now in todo:  # every run checked before the first one starts
        _refuse_other_settings(out, folder, now)
    results = []
    for folder, config, now in todo:
        record_file, done = out / folder / "run.json", out / folder / "result.json"
        if done.is_file():
            print(f"{folder}: done before ({done})", flush=True)
            results.append(json.loads(done.read_text()))
            continue
        record = json.loads(record_file.read_text()) if record_file.is_file() else None
        config = config.named(f"multirun/{name}", folder).resumed(record)
        if config.ckpt_path:
            print(f"{folder}: resuming (--ckpt_path={config.ckpt_path})", flush=True)
        record_file.parent.mkdir(parents=True, exist_ok=True)
        started = runs.RunStarted(
            lambda started, path=record_file, now=now: path.write_text(json.dumps({**started, "settings": now}))
        )
        result = {"run": folder, **asdict(runs.fit(config, callbacks=[started])), "settings": now}
        done.write_text(json.dumps(result, indent=1))
        results.append(result)
    return results, out


def _refuse_other_settings(out: Path, folder: str, now: dict[str, Any]) -> None:
    """A finished or started run of `folder` with other flags or config contents is not this run."""
    for file in (out / folder / "result.json", out / folder / "run.json"):
        if file.is_file():
            before = json.loads(file.read_text()).get("settings", now)  # runs saved without settings: kept
            if before != now:
                raise ConfigError(
                    f"{out / folder} was run with other train.py settings ({runs.differences(before, now)}):"
                    f" give --name a new name for a new set of runs, or delete {out} to run this set again."
                )
            return


def summary_rows(results: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows: one row per run, then mean and std (n-1) of every metric."""
    monitor = results[0]["monitor"]
    keys = sorted({k for r in results for k in r["metrics"] if k.startswith(("val_", "test_"))} - {monitor})
    columns = ["run", f"best {monitor}", *keys]

    def values(result: dict[str, Any]) -> list[float]:
        return [result["best_score"], *(result["metrics"].get(k, math.nan) for k in keys)]

    table = [values(r) for r in results]
    rows = [[r["run"], *(f"{v:.4f}" for v in vals)] for r, vals in zip(results, table, strict=True)]
    columns_values = list(zip(*table, strict=True))
    rows.append(["mean", *(f"{statistics.fmean(c):.4f}" for c in columns_values)])
    if len(results) > 1:
        rows.append(["std", *(f"{statistics.stdev(c):.4f}" for c in columns_values)])
    return columns, rows


def write_summary(results: list[dict[str, Any]], out: Path) -> str:
    columns, rows = summary_rows(results)
    markdown = "\n".join(
        ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *("| " + " | ".join(r) + " |" for r in rows)]
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(markdown + "\n")
    (out / "summary.csv").write_text("\n".join(",".join(r) for r in [columns, *rows]) + "\n")
    mean = dict(zip(columns, rows[-2 if len(results) > 1 else -1], strict=True))
    std = dict(zip(columns, rows[-1], strict=True)) if len(results) > 1 else {}
    lines = [f"{c}: {mean[c]}" + (f" ± {std[c]}" if std else "") for c in columns[1:]]
    return markdown + "\n\nmean ± std over " + f"{len(results)} runs:\n  " + "\n  ".join(lines)
