"""Drawing a followed run: a live bar on a terminal, plain lines when piped (a log file or
CI has no cursor to move, and wants one line per change, not a redraw per poll), JSON
lines with --json."""

from __future__ import annotations

import json
import time

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from rollway_cli.follow import Snapshot

# Piped, a line is printed when the run's status, phase or metrics change, and otherwise
# once this often, so a long warm start still shows the clock moving in a log.
HEARTBEAT_S = 30.0

STATUS_STYLE = {
    "queued": "yellow",
    "starting": "yellow",
    "running": "cyan",
    "cancelling": "magenta",
    "cancelled": "magenta",
    "succeeded": "green",
    "failed": "red",
}


def number(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_text(s: Snapshot) -> str:
    p = s.progress
    if p is None:
        return "no progress yet"
    if p.unit == "steps":
        return f"step {int(p.done)}/{int(p.total)} ({p.fraction:.0%})"
    return f"{p.done:.1f}/{p.total:g} min ({p.fraction:.0%}; step {s.steps or 0})"


def doing(s: Snapshot) -> str:
    """What the run is doing, in a few words."""
    if s.is_terminal:
        return s.status  # its last phase ("stepping") is no longer what it does
    if s.status == "queued":
        return s.waiting_for or "waiting in the queue"
    return s.phase_detail or s.phase or s.status


def line(s: Snapshot) -> str:
    """One plain line: what changed is visible by comparing consecutive lines."""
    return (
        f"run {s.run} {s.status:<10} {progress_text(s)}  reward/mean={number(s.reward)} loss={number(s.loss)} "
        f"samples/s={number(s.samples_per_s, 1)} elapsed={duration(s.elapsed_s)}  [{doing(s)}]"
    )


def ending(s: Snapshot) -> str:
    text = f"run {s.run} {s.status} after {s.steps or 0} steps in {duration(s.elapsed_s)}"
    if s.reward is not None:
        text += f" (final reward/mean {number(s.reward)})"
    if s.status == "failed" and s.error:
        text += f"\nerror: {s.error}"
    return text


def panel(s: Snapshot) -> Group:
    style = STATUS_STYLE.get(s.status, "")
    head = Text.assemble((f"run {s.run}", "bold"), f" {s.name}  ", (s.status, style), f"  {doing(s)}")
    p = s.progress
    bar = ProgressBar(total=p.total if p else None, completed=p.done if p else 0, width=40)
    row = Table.grid(padding=(0, 2))
    row.add_row(bar, progress_text(s), f"elapsed {duration(s.elapsed_s)}")
    figures = Text(
        f"reward/mean {number(s.reward)}   loss {number(s.loss)}   samples/s {number(s.samples_per_s, 1)}",
    )
    return Group(head, row, figures)


class View:
    """Shown with `show(snapshot)` per poll, then `close(last)`."""

    def __init__(self, console: Console, *, as_json: bool = False, live: bool | None = None):
        self.console = console
        self.as_json = as_json
        self.live_mode = console.is_terminal if live is None else live
        self.live: Live | None = None
        self._last_key: tuple | None = None
        self._last_printed_s = float("-inf")

    def show(self, s: Snapshot) -> None:
        if self.as_json:  # JSON lines, terminal or not
            print(json.dumps(s.as_json()), flush=True)
        elif self.live_mode:
            if self.live is None:
                self.live = Live(panel(s), console=self.console, refresh_per_second=4, transient=False)
                self.live.start()
            else:
                self.live.update(panel(s))
        else:
            # The phase, not its detail: a warm start's detail counts its steps every poll,
            # which would print a line a second for a minute.
            what = s.phase if s.status == "running" and s.phase else doing(s)
            key = (s.status, what, s.steps, s.reward, s.loss, s.samples_per_s)
            now = time.monotonic()
            if key != self._last_key or now - self._last_printed_s >= HEARTBEAT_S:
                print(line(s), flush=True)
                self._last_key, self._last_printed_s = key, now

    def note(self, message: str) -> None:
        if self.live is not None:
            self.live.console.print(message)
        elif not self.as_json:
            print(message, flush=True)

    def close(self, last: Snapshot | None) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        if last is not None and not self.as_json:
            if self.live_mode:
                self.console.print(ending(last), style=STATUS_STYLE.get(last.status, ""))
            else:
                print(ending(last), flush=True)
