"""``loadertune run``: run a script for real with the saved settings (the work is in
:func:`loadertune.api.saved.run_script`), or tune it while it trains (``--tune``:
:func:`loadertune.api.run_tuned.run_script_tuned`)."""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

import click

from loadertune import tracebacks
from loadertune.api import saved
from loadertune.cli._common import (
    ScriptCommand,
    batch_sizes_option,
    budget_option,
    err,
    fail,
    file_option,
    loader_option,
    nproc_option,
)
from loadertune.errors import LoadertuneError
from loadertune.trials.script.reported import LAUNCHER_ENV


@click.command(cls=ScriptCommand, context_settings={"ignore_unknown_options": False})
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@file_option("--file", "path", default="loadertune.json", help="Recommendation file.")
@click.option(
    "--tune",
    is_flag=True,
    help="Tune the DataLoader during the first --budget seconds of this run, on its own training "
    "loop, then go on with the winner and save it to --file.",
)
@budget_option("With --tune: seconds of the run spent trying settings (every batch still trains).")
@batch_sizes_option("With --tune: batch sizes the run may switch to (default: keep the script's).")
@loader_option(
    "With --tune: which DataLoader, N (order of creation, from 1) or FILE:LINE (your line that "
    "creates it); default: the saved entry's, else the first the script iterates."
)
@nproc_option(
    "Run SCRIPT as `torchrun --standalone --nproc-per-node N` would, with the entry "
    "tuned at that world size."
)
def run(
    script: str,
    script_args: tuple[str, ...],
    path: str,
    tune: bool,
    budget_s: float,
    batch_sizes: list[int] | None,
    loader: int | str | None,
    nproc_per_node: int | None,
) -> None:
    """Run SCRIPT for real with this machine's saved settings applied to its DataLoader.

    With --tune, the run also tunes it: the first --budget seconds try settings on the live
    training loop, then the winner runs to the end and is saved.
    """
    if tune and nproc_per_node is not None:
        raise click.UsageError(
            "--tune runs in one training process; --nproc-per-node runs several: tune with "
            "`loadertune search --nproc-per-node N SCRIPT`, then `loadertune run "
            "--nproc-per-node N SCRIPT` applies the entry"
        )
    report = lambda line: err.print(line, soft_wrap=True)  # noqa: E731
    try:
        if tune:
            from loadertune.api.run_tuned import run_script_tuned

            code = run_script_tuned(
                script,
                script_args,
                path=path,
                budget_s=budget_s,
                batch_size=batch_sizes,
                loader=loader,
                report=report,
            )
        else:
            code = saved.run_script(
                script, script_args, path=path, report=report, nproc_per_node=nproc_per_node
            )
    except LoadertuneError as exc:
        fail(exc)
    except KeyboardInterrupt:
        # Ctrl-C ends the script as it ends `python SCRIPT`: its traceback, then 130 (click
        # would print "Aborted!" and exit 1).
        print(tracebacks.trim(traceback.format_exc().rstrip()).text, file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        shown = script_traceback(exc, script)
        if shown is None:  # not the script's: loadertune's own, shown whole
            raise
        print(shown, file=sys.stderr)
        if LAUNCHER_ENV in str(exc):
            err.print(f"loadertune: {NEEDS_LAUNCHER_TO_RUN}", soft_wrap=True)
        sys.exit(1)  # as `python SCRIPT` ends on an exception
    sys.exit(code)


NEEDS_LAUNCHER_TO_RUN = (
    "the script calls torch.distributed.init_process_group(), which needs the environment "
    "torch's launcher sets (RANK, WORLD_SIZE, MASTER_ADDR): run it as torchrun runs it, with "
    "`loadertune run --nproc-per-node N SCRIPT -- ARGS` (N: the size its entry was tuned at)"
)


def script_traceback(exc: BaseException, script: str) -> str | None:
    """``exc``'s traceback as `python SCRIPT` shows it: from the script's first frame on (the
    frames of click, loadertune and runpy above it left out), torch's and Python's marked as
    left out; None when no frame is the script's, or the exception was raised in loadertune's
    own code (a bug of ours, under the script's loop: shown whole). Without the cut, a
    user's own line sits under a screenful of loadertune's and click's frames."""
    target = os.path.realpath(script)
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    if tb is None or _raised_in_loadertune(tb):
        return None
    text = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
    return tracebacks.trim(text).text


# From this file, not loadertune.__file__: see loadertune.trials.inside.identity.PACKAGE_DIR.
_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")


def _raised_in_loadertune(tb: TracebackType) -> bool:
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.realpath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR)
