"""Many runs of train.py: hyperparameter search (tune.py), seeds and k-fold (multirun.py)."""
