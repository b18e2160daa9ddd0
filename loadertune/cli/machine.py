"""``loadertune hardware`` and ``loadertune doctor``: this machine, as loadertune sees it."""

from __future__ import annotations

import json

import click
from rich.text import Text

from loadertune import doctor, hardware
from loadertune.view.console import plain_console


@click.command(name="hardware")
@click.option("--json", "as_json", is_flag=True, help="Print the fingerprint as JSON.")
def hardware_cmd(as_json: bool) -> None:
    """Print this machine's fingerprint and its key."""
    hw = hardware.detect()
    if as_json:
        click.echo(json.dumps(hw.to_dict(), indent=2, default=str))
    else:
        click.echo(f"{hw.key}\n{hw.describe()}")


_LEVEL_STYLES = {doctor.OK: "green", doctor.NOTE: "yellow", doctor.PROBLEM: "bold red"}


@click.command(name="doctor")
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
