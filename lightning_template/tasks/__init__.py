"""The project's own code: one package per task (models, datamodules, the callbacks only that task needs).

Each task is plain Lightning on top of the engine (`lightning_template/engine/`), which imports no task.
"""
