"""Callbacks of this template. Lightning's own (ModelCheckpoint, EarlyStopping,
LearningRateMonitor) are wired in `configs/`; classes exported here are selectable
in a config by name, e.g. `class_path: callbacks.<Name>`."""
