"""The project's package: the engine (`engine/`: the CLI, exact resume, checkpoints, the console, for any model and
data) and the tasks (`tasks/`: models, datamodules, callbacks). Any other subpackage is an optional extra, which
these two never import."""
