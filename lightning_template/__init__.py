"""A PyTorch Lightning project template: the core (CLI, models, datamodules, exact resume, fine-tuning) and its
extras (search, serving, streaming, tools), each extra a subpackage that the core never imports."""
