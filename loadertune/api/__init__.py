"""The ways in: search for settings (:func:`tune_loader`, :func:`tune_script`), tune while
training (:func:`tuned`, ``loadertune run --tune``), and use saved settings
(:func:`load_recommendation`, ``loadertune run``).
"""

from loadertune.api.live import tuned
from loadertune.api.run_tuned import run_script_tuned
from loadertune.api.saved import load_recommendation, run_script
from loadertune.api.tune import tune_loader, tune_script

__all__ = [
    "load_recommendation",
    "run_script",
    "run_script_tuned",
    "tune_loader",
    "tune_script",
    "tuned",
]
