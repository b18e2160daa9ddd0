"""Inside a script trial: run the user's script as ``python train.py ARGS`` would, and measure it.

Started by :class:`loadertune.trials.script.runner.ScriptRunner` as ``python -m
loadertune.trials.inside.child`` (or forked from :mod:`loadertune.trials.script.forkserver`, which
then calls :func:`main`), in a process group of its own, with the trial's spec in
``$LOADERTUNE_TRIAL`` and one end of a :class:`~loadertune.trials.channel.Channel` as an inherited
file descriptor.

The script gets ``sys.argv``, ``__name__ == "__main__"``, its own directory first on ``sys.path``
and the caller's working directory. A :class:`~loadertune.trials.inside.controller.TrialController`,
which :mod:`loadertune.trials.inside.patch` calls, applies the trial's settings to the target loader
when the script creates it and meters the script's own loop over it. When the window is full, the
result goes to the parent. A loader that can change setting mid-epoch
(:mod:`loadertune.trials.hotswap.swap`) then measures the next setting the parent sends, in this
same process (:mod:`loadertune.trials.inside.sequence`); any other loader's process waits for the
parent to snapshot the process tree and kill the group. The script is not run to completion.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
from typing import Any

from loadertune.measure import failures
from loadertune.trials import leftovers, lifeline, messages
from loadertune.trials import loader as dl
from loadertune.trials import torch_internals as _internals
from loadertune.trials.channel import Channel
from loadertune.trials.inside.controller import TrialController
from loadertune.trials.inside.patch import patched

SPEC_ENV = "LOADERTUNE_TRIAL"


def _report_failure(controller: TrialController, chan: Channel, exc: BaseException) -> None:
    """Send the script's exception: where it came from, its text, its traceback."""
    meter, iterator, num_workers = controller.active()
    signals = _internals.dead_worker_signals(iterator, exc) if iterator is not None else ()
    chan.send(
        messages.FailureMsg(
            t="failure",
            where="loader" if meter is not None and meter.failed_in_next else "script",
            num_workers=num_workers,
            text="\n".join([*map(failures.signal_text, signals), failures.chain_text(exc)]),
            traceback=failures.format_exception(exc),
        )
    )


def run_as_main(script: str, args: list[str]) -> None:
    """Run ``script`` as ``python script args`` would: argv, ``__main__``, its directory first
    on the path."""
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def _connect(spec: dict[str, Any]) -> Channel:
    """This trial's channel to the search: an inherited descriptor, or, for a rank that torch's
    launcher started (``spec["listen"]``), a socket it connects to and says which rank it is."""
    if not spec.get("listen"):
        lifeline.die_with_parent(spec["parent_pid"])  # and each worker: DieWithTrial
        return Channel.from_fd(spec["fd"])
    lifeline.die_with_parent(os.getppid())  # the launcher's agent, which dies with the search
    spec["rank"] = int(os.environ["RANK"])
    chan = Channel.connect(spec["listen"])
    chan.send(messages.HelloMsg(t="hello", rank=spec["rank"], pid=os.getpid()))
    return chan


def main() -> None:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    chan = _connect(spec)
    leftovers.own_temp_dir()  # its workers' too (they inherit it): removed with the group
    controller = TrialController(spec, chan)
    how = "the script ended"
    with dl.quiet_worker_warning(), patched(controller):
        error = _internals.contained(functools.partial(run_as_main, spec["script"], spec["args"]))
        if isinstance(error, SystemExit):
            how = f"the script exited with status {error.code}"
        elif error is not None and controller.raised_after_training():
            how = (
                f"the script raised {type(error).__name__} after its loop over the tuned "
                "loader ended"
            )
        elif error is not None:  # the script's own exception: report it, then end
            _internals.settle(functools.partial(_report_failure, controller, chan, error))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    controller.script_ended(how)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
