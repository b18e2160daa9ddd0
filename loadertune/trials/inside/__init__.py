"""Code that runs inside the user's own process: a script trial's child (the script run as
``python train.py`` would, its loaders patched, found, set and metered) and ``loadertune run``
applying saved settings to a script's loaders.

Nothing here imports the search; the search's side of a script trial is
:mod:`loadertune.trials.script`, and the two talk over :mod:`loadertune.trials.channel`.
"""
