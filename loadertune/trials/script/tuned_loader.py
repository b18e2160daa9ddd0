"""The loader a script's trials tune, from the search's side: how the user names it, the note
that names it once a trial found it, and the digest of the code it was found in (a resumed
search trusts the loader's key only for the same code)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loadertune.errors import ConfigError
from loadertune.trials import messages
from loadertune.trials.inside.identity import target_line


def selector(loader: int | str | None) -> dict[str, Any]:
    """The trial spec's names for ``loader``: its order of creation (``index``, 1 = the first
    created), or ``"FILE:LINE"`` where it is created (``call_site``); none for None."""
    if isinstance(loader, int):
        if loader < 1:
            raise ConfigError(
                f"loader must be >= 1 (1 = the first DataLoader created), but got {loader!r}."
            )
        return {"index": loader}
    if isinstance(loader, str):
        if not loader.rpartition(":")[2].isdigit():
            raise ConfigError(f"loader must be N or FILE:LINE, but got {loader!r}.")
        return {"call_site": loader}
    return {}


def target_note(msg: Mapping[str, Any]) -> str:
    """The search's note naming the loader a trial found (``msg``: its LoaderMsg)."""
    return "tuning " + target_line(
        index=msg["index"],
        call_site=msg["call_site"],
        dataset=msg["dataset"],
        batch_size="None"
        if msg["batch_size_fixed"] == messages.NO_BATCHING
        else "its batch sampler's"
        if msg["batch_size_fixed"]
        else msg["settings"].get("batch_size"),
        chosen_by=msg["chosen_by"],
        rebuilt=msg["origin"] is not None,
        key=msg["key"],
    )


def code_digest(script: str, loader: Mapping[str, Any]) -> str | None:
    """One digest of the script and the user's modules it had imported when its loader was
    found (as ``loader``, the first trial's LoaderMsg, says); None if one cannot be read."""
    sources = loader.get("sources") or []
    return _digest_all(sorted({os.path.realpath(script), *sources}))


def _digest(path: str) -> str | None:
    try:
        return hashlib.sha1(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _digest_all(paths: list[str]) -> str | None:
    """One digest of the files' names and contents (None if one cannot be read)."""
    h = hashlib.sha1()
    for path in paths:
        digest = _digest(path)
        if digest is None:
            return None
        h.update(f"{path}\0{digest}\0".encode())
    return h.hexdigest()
