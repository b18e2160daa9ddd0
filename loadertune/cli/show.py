"""``loadertune show``: the entries of a recommendation file, per machine and workload."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from loadertune import hardware
from loadertune.cli._common import err, fail
from loadertune.config import kwargs_label
from loadertune.errors import LoadertuneError
from loadertune.results import store
from loadertune.view.console import plain_console
from loadertune.view.summary import noise_words


@click.command()
@click.argument("path", default="loadertune.json", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the file's entries as JSON.")
def show(path: str, as_json: bool) -> None:
    """List the entries of a recommendation file, per machine and workload; this machine's is
    marked."""
    try:
        doc = store.read(path)
    except LoadertuneError as exc:
        fail(exc)
    if not doc["machines"]:
        err.print(f"{path}: no entries (run `loadertune search` first)", highlight=False)
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
    why = store.partial_why(entry)
    partial = (f"  (partial: {why})", "yellow") if why else ""
    console.print(Text.assemble(f"  {workload}", partial), soft_wrap=True)
    kwargs = entry["loader_kwargs"]
    rate = entry.get("samples_per_s")
    label = kwargs_label(kwargs) if kwargs else "-"
    speed = f"{rate:,.0f} samples/s" if rate else "-"
    speedup = entry.get("speedup")
    noise = noise_words(entry)
    noise = f", {noise}" if noise else ""
    console.print(
        f"    {label}  {speed}"
        + (f"  ({speedup:.2f}x over baseline{noise})" if speedup else "")
        + f"  measured {entry.get('measured_at', '?')}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"    {json.dumps(kwargs, default=str)}", highlight=False, soft_wrap=True)
