"""What the commands share: the error console and how a loadertune error ends a command, and the
options that more than one command takes (with their checks)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click
from rich.text import Text

from loadertune.errors import LoadertuneError, UserCodeError
from loadertune.view.console import plain_console

# Text from users and libraries (paths, tracebacks, gloo's "[/path/pair.cc:553]") is printed as
# it is: these consoles never parse markup; styles come from Text objects.
err = plain_console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def say(style: str, message: object) -> None:
    err.print(Text.assemble(("loadertune:", style), f" {message}"), soft_wrap=True)


def fail(exc: LoadertuneError) -> NoReturn:
    """Print ``exc`` and exit with status 1."""
    if isinstance(exc, UserCodeError):  # opens with FILE:LINE in the user's code, as compilers do
        first, _, rest = str(exc).partition("\n")
        err.print(Text(first, style="bold red"), soft_wrap=True)
        err.print(rest, soft_wrap=True)
    else:
        say("bold red", exc)
    sys.exit(1)


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


class ScriptCommand(click.Command):
    """A command that runs a script with arguments of its own: an option it does not know
    (the script's ``--epochs`` before ``--``) is told where the script's arguments go."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            raise click.NoSuchOption(
                exc.option_name,
                message=f"{exc.message.rstrip('.')}: the script's own arguments go after `--` "
                f"(loadertune {self.name} [OPTIONS] SCRIPT -- ARGS)",
                ctx=exc.ctx,
            ) from None


def budget_option(help: str) -> Callable[[F], F]:
    """``--budget`` in seconds (search, and run --tune)."""
    return click.option(
        "--budget",
        "budget_s",
        type=click.FloatRange(min=0, min_open=True),
        default=60.0,
        show_default=True,
        help=help,
    )


def batch_sizes_option(help: str) -> Callable[[F], F]:
    """``--batch-sizes 32,64,128`` (search, and run --tune)."""
    return click.option("--batch-sizes", callback=_batch_sizes, default=None, help=help)


def loader_option(help: str) -> Callable[[F], F]:
    """``--loader N`` (order of creation) or ``--loader FILE:LINE`` (search)."""
    return click.option("--loader", callback=_loader, default=None, help=help)


def nproc_option(help: str) -> Callable[[F], F]:
    """``--nproc-per-node N``: the script runs as torchrun would run it (search, run)."""
    return click.option(
        "--nproc-per-node", type=click.IntRange(min=1, max=64), default=None, help=help
    )


def file_option(*decls: str, default: str | None, help: str) -> Callable[[F], F]:
    """An option naming a file (not a folder); its default, if any, shown in the help."""
    return click.option(
        *decls,
        default=default,
        show_default=default is not None,
        type=click.Path(dir_okay=False),
        help=help,
    )
