"""Command-line entry point: `python train.py fit|validate|test|predict --config configs/<job>.yaml`.

The CLI itself (options, installed callbacks, error handling) is `lightning_template/engine/cli.py`.
"""

from lightning_template.engine.cli import main

if __name__ == "__main__":
    main()
