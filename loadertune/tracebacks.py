"""A traceback as the user should read it: their own frames, loadertune's, torch's and the
standard library's left out (one marked line per run of them), and where in their code it
went wrong.

Works on text: a script trial's traceback arrives from another process as text, and a worker's
is inside the message of the exception torch re-raises ("Original Traceback ...").
"""

from __future__ import annotations

import importlib.util
import os
import re
import sysconfig
from dataclasses import dataclass
from functools import cache

_FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_THIRD_PARTY = ("site-packages", "dist-packages")


@cache
def _hidden_roots() -> tuple[str, ...]:
    """Folders whose frames are not the user's: loadertune, torch, the standard library."""
    roots = [os.path.dirname(os.path.abspath(__file__))]
    spec = importlib.util.find_spec("torch")  # found, not imported
    if spec is not None and spec.submodule_search_locations:
        roots += list(spec.submodule_search_locations)
    paths = sysconfig.get_paths()
    roots += [paths["stdlib"], paths["platstdlib"]]
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots)


def is_hidden(filename: str) -> bool:
    """Whether a frame in ``filename`` is loadertune's, torch's or Python's own."""
    if filename.startswith("<"):  # <frozen runpy>, <string>
        return True
    real = os.path.join(os.path.realpath(filename), "")
    return real.startswith(_hidden_roots())


@dataclass(frozen=True)
class Trimmed:
    """A traceback trimmed to the user's frames.

    Attributes:
        text: the traceback, each run of hidden frames replaced by one marked line.
        origin: ``FILE:LINE in FUNCTION`` of the innermost frame of the user's own code (not a
            library's), or None when the traceback shows none.
        exception: the exception line raised there (``ValueError: cannot decode``), or None.
        hidden: how many frames were left out.
    """

    text: str
    origin: str | None
    exception: str | None
    hidden: int


def _marker(indent: str, n: int) -> str:
    frames = "frame" if n == 1 else "frames"
    return f"{indent}[{n} {frames} of loadertune, torch or Python left out]"


def trim(text: str) -> Trimmed:
    """Trim ``text`` (one or more tracebacks, with any other output around them)."""
    lines = text.splitlines()
    out: list[str] = []
    hidden = run = 0
    run_indent = ""
    origin_at: int | None = None  # index in `lines` of the user's innermost frame
    origin: str | None = None
    i = 0
    while i < len(lines):
        match = _FRAME.match(lines[i])
        if match is None:
            if run:
                out.append(_marker(run_indent, run))
                run = 0
            out.append(lines[i])
            i += 1
            continue
        indent = match["indent"]
        end = i + 1  # the frame's code and ^^^ lines are indented deeper than its header
        while (
            end < len(lines)
            and lines[end].startswith(indent + " ")
            and not _FRAME.match(lines[end])
        ):
            end += 1
        if is_hidden(match["file"]):
            hidden += 1
            run += 1
            run_indent = indent
        else:
            if run:
                out.append(_marker(indent, run))
                run = 0
            out.extend(lines[i:end])
            if not any(part in match["file"] for part in _THIRD_PARTY):
                origin_at = end
                origin = f"{match['file']}:{match['line']} in {match['func']}"
        i = end
    if run:
        out.append(_marker(run_indent, run))
    exception = None
    if origin_at is not None:
        exception = next(
            (
                line.strip()
                for line in lines[origin_at:]
                if line.strip() and not line[0].isspace() and not _FRAME.match(line)
            ),
            None,
        )
    return Trimmed("\n".join(out), origin, exception, hidden)
