"""models of the classification task (exported by lightning_template.tasks.classification)."""
