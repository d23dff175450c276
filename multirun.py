"""One job over several seeds or k folds, summarised as mean ± std of its validation and test metrics.

    python multirun.py --config configs/simple_cnn.yaml --seeds 42 7 123
    python multirun.py --config configs/simple_cnn.yaml --folds 5 --trainer.max_epochs=3
    python multirun.py --config configs/simple_cnn.yaml --seeds 1 2 3 4 --workers 2   # 2 runs at once

Every flag that is not one of the options below goes to every run's `train.py fit`. Runs and the summary
(summary.md, summary.csv) are in logs/multirun/<name>/. Rerun the same command after a stop:
finished runs are kept, an interrupted one resumes from its last.ckpt. With other flags (or an
edited config) under the same --name it is refused, naming what changed. `--workers N` trains N runs at
once (one per GPU, or sharing the CPU's threads); a run whose process dies is taken over by another.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from jsonargparse import ArgumentParser

from lightning_template.engine.errors import ProjectError
from lightning_template.script_args import did_you_mean, parse_known, script_parser
from lightning_template.search import runs, workers
from lightning_template.search.repeat import collected, plan, run_pending, variants, write_summary


def parser() -> ArgumentParser:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--config", action="append", required=True, help="Job config, as for train.py; given again, stacked in order."
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seeds", type=int, nargs="+", help="Run once per seed (--seed_everything).")
    which.add_argument("--folds", type=int, help="k-fold cross-validation: run folds 0..K-1 (--data.num_folds K).")
    parser.add_argument(
        "--name", type=str | None, default=None,
        help="Folder under logs/multirun/; null: <job>-seeds or <job>-<K>fold.",
    )  # fmt: skip
    workers.add_options(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    multirun_parser = parser()
    args, train_flags = parse_known(multirun_parser, argv)
    job = Path(args.config[0]).stem
    name = args.name or (f"{job}-{args.folds}fold" if args.folds else f"{job}-seeds")
    flags = [*(f"--config={c}" for c in args.config), *train_flags]
    try:
        chosen = variants(args.seeds, args.folds)
        workers.set_threads(args.threads)
        base = runs.RunConfig.parse(flags)
        environments = workers.assignments(args.workers, str(base.namespace.trainer.get("accelerator")))
        out, todo = plan(base, name, chosen)
        if args.workers > 1:
            codes = workers.launch(__file__, [argv] * args.workers, environments)
            if 128 + signal.SIGTERM in codes:
                raise runs.Interrupted
            for i, code in enumerate(codes):
                if code != 0:
                    print(f"worker {i} {workers.describe(code)}", flush=True)
        else:
            run_pending(out, name, todo)
    except (ValueError, ProjectError) as err:  # train.py's refusals (a flag, a missing file): one line, exit 1
        sys.exit(f"multirun.py: {err}\n{did_you_mean(str(err), multirun_parser, getattr(err, 'options', ()))}".rstrip())
    except runs.Interrupted:
        print("Stopped: run the same command to finish the set.", flush=True)
        sys.exit(128 + signal.SIGTERM)
    if args.worker:  # the process that started this one writes the summary
        return
    results, missing = collected(out, todo)
    if missing:
        sys.exit(f"multirun.py: {', '.join(missing)} not finished: run the same command to finish the set.")
    print(write_summary(results, out), flush=True)
    print(f"Summary: {out / 'summary.md'} and summary.csv", flush=True)


if __name__ == "__main__":
    main()
