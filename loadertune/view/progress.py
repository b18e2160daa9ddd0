"""The live view of a search as it runs: in a terminal a small rich panel (trial in progress,
best so far, budget left), redrawn at each event rather than by a timer thread, so it costs the
measured loop nothing; when stdout is not a terminal, one plain line per trial.
"""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from loadertune.config import Config, kwargs_label
from loadertune.trials import TrialResult
from loadertune.view.console import percent_text, plain_console, rate_text


def trial_line(result: TrialResult) -> str:
    """One line per trial: phase, setting, rate or cause."""
    m = result.measurement
    if result.failure is not None:
        what = f"FAILED {result.failure.kind}: {result.failure.message}"
    elif result.skipped:
        what = f"skipped: {result.skipped}"
    else:
        what = f"{rate_text(result.samples_per_s)} samples/s"
        epoch = result.epoch_samples_per_s
        if epoch and result.samples_per_s and abs(epoch / result.samples_per_s - 1) > 0.1:
            # what the search ranks by: each epoch's start-up counted, which can reorder
            # settings whose window rates alone would rank otherwise
            what += f" ({rate_text(epoch)} per epoch)"
        if m is not None:
            what += f"  blocked {percent_text(m.blocked_fraction)}  spread {percent_text(m.spread)}"
        if result.pruned:
            what += "  (pruned)"
    if result.extra.get("settings_unknown"):
        label = "the script's own"
    elif result.extra.get("batch_size_fixed"):
        label = kwargs_label({**result.params, "batch_size": None})
    else:
        label = result.config.label()
    return f"{result.phase:<8} {label:<32} {what}"


class LiveView:
    """An :class:`loadertune.search.Observer` that shows the search as it runs."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or plain_console(stderr=True)
        self._live: Live | None = None
        self._deadline = 0.0
        self._phase = ""
        self._current: str | None = None
        self._best: TrialResult | None = None
        self._n = 0
        self._last: list[str] = []

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            self._live = Live(
                self._render(), console=self.console, auto_refresh=False, transient=False
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def _render(self) -> Group:
        left = max(0.0, self._deadline - time.monotonic())
        head = Text(
            f"loadertune · {self._phase or 'starting'} · trial {self._n} · "
            f"{left:.0f} s of budget left",
            style="bold",
        )
        best = (
            f"best so far: {self._best.config.label()}  "
            f"{rate_text(self._best.epoch_samples_per_s)} samples/s"
            if self._best
            else "best so far: -"
        )
        now = f"running: {self._current}" if self._current else ""
        return Group(
            head, Text(best), Text(now), *[Text(line, style="dim") for line in self._last[-5:]]
        )

    def _print(self, line: str) -> None:
        """A plain line, written to the console's file as it is. Not through ``Console.print``:
        it clears its buffer only after the write, and a Ctrl-C that lands in between (the user
        presses it on seeing the line) leaves the line there for the next print to repeat."""
        file = self.console.file
        file.write(line + "\n")
        file.flush()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)

    def search_started(self, deadline: float, budget_s: float) -> None:
        self._deadline = deadline
        if self._live is None:
            self._print(f"loadertune: searching for up to {budget_s:.0f} s")
        self._refresh()

    def phase(self, name: str) -> None:
        self._phase = name
        self._refresh()

    def trial_started(self, config: Config | None, phase: str) -> None:
        self._n += 1
        self._current = f"{phase} {config.label() if config else '(its own settings)'}"
        self._refresh()

    def note(self, text: str) -> None:
        self._last.append(text)
        if self._live is None:
            self._print(f"loadertune: {text}")
        self._refresh()

    def trial_finished(self, result: TrialResult, best: TrialResult | None) -> None:
        self._best = best
        self._current = None
        line = trial_line(result)
        self._last.append(line)
        if self._live is None:
            self._print(line)
        self._refresh()
