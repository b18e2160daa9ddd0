"""The ``loadertune`` command: options, validation and printing. The work is in ``loadertune.api``.

One module per command group: :mod:`.search`, :mod:`.run`, :mod:`.show`, :mod:`.report` and
:mod:`.machine` (``hardware``, ``doctor``); :mod:`._common` holds the options they share and the
error output.

Exit codes: 0 success, 1 a loadertune error (with a message), 2 a usage error (click's),
130 interrupted by Ctrl-C, 143 by SIGTERM. A training script's own exit status is returned by
``loadertune run``.
"""

from __future__ import annotations

import faulthandler
import signal

import click

from loadertune import __version__
from loadertune.cli.machine import doctor_cmd, hardware_cmd
from loadertune.cli.report import report
from loadertune.cli.run import run
from loadertune.cli.search import search
from loadertune.cli.show import show

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="loadertune")
def cli() -> None:
    """Find the fastest PyTorch DataLoader settings for this machine.

    \b
    loadertune search train.py -- --epochs 3   tune the script's loader, save loadertune.json
    loadertune run train.py -- --epochs 3      run it for real with the saved settings
    loadertune show                            list the saved settings per machine, workload
    """


for _command in (search, run, show, report, hardware_cmd, doctor_cmd):
    cli.add_command(_command)


def main() -> None:
    # `kill -USR1 PID` prints where every thread of a search is (for a search that seems stuck).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    cli(prog_name="loadertune")
