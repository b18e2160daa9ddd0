"""The search's side of script trials: start the user's script as a trial process (or a fork of
the fork server, or N ranks under torch's launcher), send it settings, read its results, and
kill it however a trial ends. What runs inside that process is :mod:`loadertune.trials.inside`.
"""
