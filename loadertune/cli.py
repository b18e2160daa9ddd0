"""The ``loadertune`` command: options, validation and printing. The work is in ``loadertune.api``.

Exit codes: 0 success, 1 a loadertune error (with a message), 2 a usage error (click's),
130 interrupted by Ctrl-C, 143 by SIGTERM. A training script's own exit status is returned by
``loadertune run``.
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.text import Text

from loadertune import __version__, api, doctor, hardware, plots, saved, store
from loadertune.config import kwargs_label
from loadertune.errors import (
    LoadertuneError,
    PartialNotSaved,
    SearchInterrupted,
    UserCodeError,
)
from loadertune.report import LiveView, plain_console, print_summary
from loadertune.search import SearchSettings

# Text from users and libraries (paths, tracebacks, gloo's "[/path/pair.cc:553]") is printed as
# it is: these consoles never parse markup; styles come from Text objects.
_err = plain_console(stderr=True)


def _batch_sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated integers such as 32,64,128, got {value!r}"
        ) from None
    if not sizes or any(s < 1 for s in sizes):
        raise click.BadParameter(f"batch sizes must be positive integers, got {value!r}")
    return sizes


def _loader(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    if value is None:
        return None
    if value.isdigit():
        if int(value) < 1:
            raise click.BadParameter("loaders are numbered from 1 (the first DataLoader created)")
        return int(value)
    if ":" in value and value.rpartition(":")[2].isdigit():
        return value
    raise click.BadParameter(f"expected N (order of creation) or FILE:LINE, got {value!r}")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be (exit 143 instead of 130)."""


@contextmanager
def _interrupts_stop() -> Iterator[None]:
    """Ctrl-C and SIGTERM end a search: the trial stopped, the study kept. Both handlers are
    set here, SIGINT's too: a CLI started in the background by a shell without job control
    inherits SIGINT ignored, and `kill -INT` would otherwise do nothing. Restored after."""

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated("SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _say(style: str, message: object) -> None:
    _err.print(Text.assemble(("loadertune:", style), f" {message}"), soft_wrap=True)


def _fail(exc: LoadertuneError) -> None:
    if isinstance(exc, UserCodeError):  # opens with FILE:LINE in the user's code, as compilers do
        first, _, rest = str(exc).partition("\n")
        _err.print(Text(first, style="bold red"), soft_wrap=True)
        _err.print(rest, soft_wrap=True)
    else:
        _say("bold red", exc)
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="loadertune")
def cli() -> None:
    """Find the fastest PyTorch DataLoader settings for this machine.

    \b
    loadertune search train.py -- --epochs 3   tune the script's loader, save loadertune.json
    loadertune run train.py -- --epochs 3      run it for real with the saved settings
    loadertune show                            list the saved settings per machine, workload
    """


F = TypeVar("F", bound=Callable[..., Any])


def _budget_option(help: str) -> Callable[[F], F]:
    """``--budget`` in seconds (search, and run --tune)."""
    return click.option(
        "--budget",
        "budget_s",
        type=click.FloatRange(min=0, min_open=True),
        default=60.0,
        show_default=True,
        help=help,
    )


def _batch_sizes_option(help: str) -> Callable[[F], F]:
    """``--batch-sizes 32,64,128`` (search, and run --tune)."""
    return click.option("--batch-sizes", callback=_batch_sizes, default=None, help=help)


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@_budget_option("Wall-clock seconds for the whole search.")
@click.option(
    "--trials",
    "n_trials",
    type=click.IntRange(min=1),
    default=None,
    help="Cap on the settings measured (default: the budget decides).",
)
@_batch_sizes_option("Batch sizes to search, e.g. 32,64,128 (default: keep the script's).")
@click.option(
    "--max-workers",
    type=click.IntRange(min=0),
    default=None,
    help="Highest num_workers to try (default: from CPUs and memory).",
)
@click.option(
    "--loader",
    callback=_loader,
    default=None,
    help="Which DataLoader: N (order of creation) or FILE:LINE (default: the first iterated).",
)
@click.option(
    "--storage", default=None, help="Optuna storage URL (default: SQLite in the user cache)."
)
@click.option(
    "--study", "study_name", default=None, help="Study name (default: from script and args)."
)
@click.option(
    "--resume/--fresh",
    default=True,
    show_default=True,
    help="Continue the study of an earlier (interrupted) search, or start it afresh.",
)
@click.option(
    "--save-partial",
    is_flag=True,
    help="On Ctrl-C or SIGTERM, save the best setting so far (marked partial).",
)
@click.option(
    "--out",
    default="loadertune.json",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Recommendation file to merge this machine's entry into.",
)
@click.option("--force", is_flag=True, help="Replace an unreadable --out file (a copy is kept).")
@click.option("--window", "window_s", type=float, default=None, help="Measured seconds per trial.")
@click.option(
    "--startup-timeout",
    "startup_timeout_s",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds the script may take to reach its first batch.",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1, max=64),
    default=None,
    help="Run every trial as `torchrun --nproc-per-node N` (a script that calls "
    "init_process_group); the rate is the node's, as its slowest rank allows.",
)
@click.option("--seed", type=int, default=None, help="Seed of the sampler.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout.")
@click.option("--show-trials", is_flag=True, help="Print every trial in the final report.")
@click.option(
    "--report",
    "report_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Also write the HTML report of the result here (see `loadertune report`).",
)
def search(
    script: str,
    script_args: tuple[str, ...],
    budget_s: float,
    n_trials: int | None,
    batch_sizes: list[int] | None,
    max_workers: int | None,
    loader: int | str | None,
    storage: str | None,
    study_name: str | None,
    resume: bool,
    save_partial: bool,
    out: str,
    force: bool,
    window_s: float | None,
    startup_timeout_s: float,
    nproc_per_node: int | None,
    seed: int | None,
    as_json: bool,
    show_trials: bool,
    report_path: str | None,
) -> None:
    """Tune the DataLoader of SCRIPT; its own arguments follow `--`.

    Each trial runs SCRIPT in a fresh process group with one setting applied, measures the
    script's own training loop for a short window, and stops it. The best setting is saved
    in --out under this machine's CPU/GPU key.
    """
    try:
        settings = SearchSettings(
            budget_s=budget_s,
            n_trials=n_trials,
            window_s=window_s,
            startup_timeout_s=startup_timeout_s,
            max_workers=max_workers,
            seed=seed,
            storage=storage,
            study_name=study_name,
            resume=resume,
        )
        if not force:
            store.read(out)  # an unreadable file is reported now, not after the search
        store.check_writable(out)  # so are a read-only file and a folder that cannot be written
        if report_path is not None:
            plots.check_installed()  # before the budget is spent, not after
        with LiveView(_err) as view, _interrupts_stop():
            rec = api.tune_script(
                script,
                script_args,
                batch_size=batch_sizes,
                loader=loader,
                settings=settings,
                observer=view,
                nproc_per_node=nproc_per_node,
            )
        path = rec.save(out, force=force)
    except SearchInterrupted as exc:
        _say("yellow", exc)
        if save_partial:
            try:
                saved_to = saved.save_partial(out, exc, force=force)
            except PartialNotSaved as err:
                _say("yellow", err)  # a complete entry is kept: not an error
            except LoadertuneError as err:
                _fail(err)
            else:
                _err.print(
                    f"loadertune: the best setting so far saved to {saved_to}, marked partial"
                    if saved_to
                    else "loadertune: no setting finished; nothing saved",
                    highlight=False,
                    soft_wrap=True,
                )
        sys.exit(143 if isinstance(exc.__cause__, _Terminated) else 130)
    except LoadertuneError as exc:
        _fail(exc)
    print_summary(rec, _err if as_json else plain_console(), trials=show_trials)
    (_err if as_json else plain_console()).print(
        f"saved to {path}", highlight=False, soft_wrap=True
    )
    if report_path is not None:
        try:
            data = plots.load(
                path,
                machine=rec.hardware.key,
                workload=store.workload_key(rec.workload, file=path),
            )
            plots.write_report(data, report_path)
        except LoadertuneError as exc:
            _fail(exc)
        (_err if as_json else plain_console()).print(
            f"report written to {report_path}", highlight=False, soft_wrap=True
        )
    if as_json:
        click.echo(
            json.dumps(
                {
                    "out": path,
                    "hardware_key": rec.hardware.key,
                    "workload_key": store.workload_key(rec.workload, file=path),
                    **rec.to_entry(),
                },
                default=str,
                indent=2,
            )
        )


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--file",
    "path",
    default="loadertune.json",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Recommendation file.",
)
@click.option(
    "--tune",
    is_flag=True,
    help="Tune the DataLoader during the first --budget seconds of this run, on its own training "
    "loop, then go on with the winner and save it to --file.",
)
@_budget_option("With --tune: seconds of the run spent trying settings (every batch still trains).")
@_batch_sizes_option("With --tune: batch sizes the run may switch to (default: keep the script's).")
@click.option(
    "--loader",
    type=click.IntRange(min=1),
    default=None,
    help="With --tune: which DataLoader, by order of creation (default: the saved entry's, "
    "else the first the script iterates).",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1, max=64),
    default=None,
    help="Run SCRIPT as `torchrun --standalone --nproc-per-node N` would, with the entry "
    "tuned at that world size.",
)
def run(
    script: str,
    script_args: tuple[str, ...],
    path: str,
    tune: bool,
    budget_s: float,
    batch_sizes: list[int] | None,
    loader: int | None,
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
    report = lambda line: _err.print(line, soft_wrap=True)  # noqa: E731
    try:
        if tune:
            from loadertune.tuning import run_script_tuned

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
        _fail(exc)
    sys.exit(code)


@cli.command()
@click.argument("path", default="loadertune.json", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the file's entries as JSON.")
def show(path: str, as_json: bool) -> None:
    """List the entries of a recommendation file, per machine and workload; this machine's is
    marked."""
    try:
        doc = store.read(path)
    except LoadertuneError as exc:
        _fail(exc)
    if not doc["machines"]:
        _err.print(f"{path}: no entries (run `loadertune search` first)", highlight=False)
        sys.exit(1)
    here = hardware.current_key()
    if as_json:
        click.echo(json.dumps({"this_machine": here, **doc}, indent=2, default=str))
        return
    console = plain_console()
    for key, machine in doc["machines"].items():
        _show_machine(console, key, machine, here=here)


def _damaged(what: str) -> tuple[str, str]:
    return (f"  damaged: {what}; `loadertune search` replaces it", "red")


def _show_machine(console: Console, key: str, machine: Any, *, here: str) -> None:
    """A machine and its entries, one per workload; a damaged record or entry in one line that
    says what is wrong."""
    mark = ("  * this machine", "bold green") if key == here else ""
    workloads = store.workloads_of(machine)
    if workloads is None:
        damage = _damaged(f'its record is a {type(machine).__name__} without a "workloads" object')
        console.print(Text.assemble((key, "bold"), mark, damage), soft_wrap=True)
        return
    console.print(Text.assemble((key, "bold"), mark), soft_wrap=True)
    usable = [e for e in workloads.values() if store.entry_problem(e) is None]
    hw = usable[0].get("hardware") if usable else None
    if isinstance(hw, dict) and hw.get("description"):
        console.print(f"  {hw['description']}", highlight=False, soft_wrap=True)
    for workload, entry in workloads.items():
        _show_entry(console, workload, entry)


def _show_entry(console: Console, workload: str, entry: Any) -> None:
    """An entry in three lines, or a damaged one in one line."""
    problem = store.entry_problem(entry)
    if problem is not None:
        console.print(
            Text.assemble(f"  {workload}", _damaged(f"the entry {problem}")), soft_wrap=True
        )
        return
    partial = ("  (partial: an interrupted search)", "yellow") if entry.get("partial") else ""
    console.print(Text.assemble(f"  {workload}", partial), soft_wrap=True)
    kwargs = entry["loader_kwargs"]
    rate = entry.get("samples_per_s")
    label = kwargs_label(kwargs) if kwargs else "-"
    speed = f"{rate:,.0f} samples/s" if rate else "-"
    speedup = entry.get("speedup")
    console.print(
        f"    {label}  {speed}"
        + (f"  ({speedup:.2f}x over baseline)" if speedup else "")
        + f"  measured {entry.get('measured_at', '?')}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"    {json.dumps(kwargs, default=str)}", highlight=False, soft_wrap=True)


@cli.command()
@click.argument("path", default="loadertune.json", type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--out",
    default="loadertune-report.html",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The HTML page to write (self-contained: it opens offline).",
)
@click.option(
    "--png",
    "png_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Also write PNG images of the main plots into this folder.",
)
@click.option("--machine", default=None, help="Machine key of the entry (default: this one).")
@click.option(
    "--workload", default=None, help="Workload key of the entry (default: the machine's only one)."
)
@click.option("--study", "study_name", default=None, help="Study to read (default: the entry's).")
@click.option("--storage", default=None, help="Its Optuna storage URL (default: the entry's).")
def report(
    path: str,
    out: str,
    png_dir: str | None,
    machine: str | None,
    workload: str | None,
    study_name: str | None,
    storage: str | None,
) -> None:
    """Write an HTML report (and PNG images) of an entry of a recommendation file: rate against
    workers per batch size, the winner beside your settings, the ceilings, memory, GPU
    utilization, the search over time, failures and advice. `loadertune show` lists the
    entries."""
    try:
        data = plots.load(
            path, machine=machine, workload=workload, study=study_name, storage=storage
        )
        written = plots.write_report(data, out, png_dir=png_dir)
    except LoadertuneError as exc:
        _fail(exc)
    console = plain_console()
    console.print(
        f"report of {data.workload} on {data.machine} ({data.study_note})",
        highlight=False,
        soft_wrap=True,
    )
    for file in written:
        console.print(f"wrote {file}", highlight=False, soft_wrap=True)


@cli.command(name="hardware")
@click.option("--json", "as_json", is_flag=True, help="Print the fingerprint as JSON.")
def hardware_cmd(as_json: bool) -> None:
    """Print this machine's fingerprint and its key."""
    hw = hardware.detect()
    if as_json:
        click.echo(json.dumps(hw.to_dict(), indent=2, default=str))
    else:
        click.echo(f"{hw.key}\n{hw.describe()}")


_LEVEL_STYLES = {doctor.OK: "green", doctor.NOTE: "yellow", doctor.PROBLEM: "bold red"}


@cli.command(name="doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def doctor_cmd(as_json: bool) -> None:
    """Check what commonly hurts data loading on this machine, as this process sees it
    (/dev/shm, CPU quota and affinity, open-file limit, NVML and busy GPUs, thread variables,
    the start method, the torch internals loadertune relies on), each with its fix. Run it the
    way training runs: same container, ulimit, taskset and environment."""
    hw = hardware.detect()
    findings = doctor.diagnose(hw)
    if as_json:
        click.echo(json.dumps(doctor.to_dict(hw, findings), indent=2, default=str))
        return
    console = plain_console()
    v = hw.versions
    console.print(Text.assemble(("loadertune doctor: ", "bold"), hw.key), soft_wrap=True)
    console.print(hw.describe(), soft_wrap=True)
    console.print(
        f"torch {v.get('torch')}, Python {v.get('python')}, loadertune {v.get('loadertune')}, "
        f"{v.get('platform')}",
        soft_wrap=True,
    )
    for f in findings:
        console.print(
            Text.assemble((f"{f.level:<8}", _LEVEL_STYLES[f.level]), f"{f.topic:<16} {f.measured}"),
            soft_wrap=True,
        )
        if f.fix:
            console.print(f"{'':<8}{'':<16} fix: {f.fix}", soft_wrap=True)
    n = sum(f.level == doctor.PROBLEM for f in findings)
    console.print(
        f"{n} problem(s) found" if n else "nothing here hurts data loading", soft_wrap=True
    )


def main() -> None:
    # `kill -USR1 PID` prints where every thread of a search is (for a search that seems stuck).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    cli(prog_name="loadertune")
