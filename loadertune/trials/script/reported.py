"""The failures a script's trial process reports, in words a user can act on.

The trial process says what happened (:mod:`loadertune.trials.messages`): the script raised, the
loader yielded no batches, or the script ended before the window. Each becomes a
:class:`~loadertune.measure.failures.Failure` here, with the script's output tail as detail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadertune.measure import failures
from loadertune.measure.failures import Failure, FailureKind
from loadertune.trials import messages
from loadertune.trials.inside.identity import matches_site

# torch.distributed.init_process_group() without the environment torch's launcher sets
LAUNCHER_ENV = "using env:// rendezvous"
NEEDS_LAUNCHER = (
    "the script calls torch.distributed.init_process_group(), which needs the environment "
    "torch's launcher sets (RANK, WORLD_SIZE, MASTER_ADDR): search it as torchrun runs it, "
    "with `loadertune search --nproc-per-node N SCRIPT -- ARGS`"
)


def with_output(text: str, output: str) -> str:
    """``text``, then the script's last output under a header (nothing when it printed none)."""
    return f"{text}\n--- script output (tail) ---\n{output}" if output.strip() else text


def raised(msg: messages.FailureMsg, output: str) -> Failure:
    """The script (or its loader) raised: classified by its text (a killed worker, shared
    memory, ...), else the script's own bug, with its traceback."""
    detail = with_output(msg["traceback"], output)
    failure = failures.classify_text(
        msg["text"], where=msg["where"], detail=detail, num_workers=msg["num_workers"]
    )
    if failure.kind != FailureKind.SCRIPT_ERROR:
        return failure
    launcher = LAUNCHER_ENV in msg["text"]
    return Failure(
        FailureKind.SCRIPT_ERROR,
        f"the script raised {msg['text'][:200]}",
        NEEDS_LAUNCHER if launcher else "fix the script; its traceback is below",
        user_bug=True,
        detail=detail,  # (the advice is said once, beside the message)
    )


def no_batches(msg: messages.NoBatchesMsg, output: str) -> Failure:
    """The loader yielded no batch: the user's bug at the script's own batch size (no other
    setting can measure it), else this setting's."""
    own = msg["own_batch_size"]
    advice = (
        "give the loader more samples than a batch, a smaller batch size or drop_last=False"
        if own
        else "this batch size is larger than the data: search smaller ones (--batch-sizes)"
    )
    return Failure(
        FailureKind.NO_BATCHES,
        f"the loader yielded no batches: {msg['why']}",
        advice,
        user_bug=own,
        # a user bug is shown with its detail only: say what to do there too
        detail=with_output(advice, output) if own else output,
    )


def ended(msg: messages.EndedMsg, selector: Mapping[str, Any], output: str) -> Failure:
    """The script ended before the window was measured."""
    what = "before its first batch" if msg["iterated"] else "without iterating the DataLoader"
    return missing_loader(msg, selector, output) or Failure(
        FailureKind.SCRIPT_ENDED,
        f"{msg['how']} {what}",
        "check the script's arguments (too few epochs or batches?) "
        "and which loader is tuned (--loader)",
        user_bug=not msg["iterated"],
        detail=output,
    )


def missing_loader(
    msg: messages.EndedMsg, selector: Mapping[str, Any], output: str
) -> Failure | None:
    """The loader asked for (``--loader N`` or ``FILE:LINE``) was never created, or None."""
    created = msg.get("created") or []
    index, site = selector.get("index"), selector.get("call_site")
    if msg["iterated"] or (index is None and not site):
        return None
    if index is not None and len(created) >= index:
        return None
    if site and any(matches_site(c, site) for c in created):
        return None
    n = len(created)
    made = f"only {n} DataLoader{'s' if n != 1 else ''}" if n else "no DataLoader"
    wanted = f"no DataLoader #{index}" if index is not None else f"no DataLoader at {site}"
    sites = ", ".join(f"#{i} at {c}" for i, c in enumerate(created, 1))
    advice = (
        f"pass --loader with one of those it created: {sites}"
        if created
        else "check that the script creates a DataLoader with these arguments"
    )
    return Failure(
        FailureKind.NO_LOADER,
        f"{msg['how']} having created {made}, so there is {wanted} (--loader)",
        advice,
        user_bug=True,  # shown with its detail only: say what to do there too
        detail=with_output(advice, output),
    )
