"""A run's advice drawn as text for the Advice tab and the run header (``tpudash.tui.advicetab``); no widget here.

``advice_text`` is everything the tab shows of one ``AdviceReport``, fitted to
the pane's width: how many rules fire, then every rule — those that fire
first (a yellow mark, the summary, the line to change), then those not
checked (and why), then the quiet ones, one green line each — then the MFU
with where its peak and its FLOPs come from, and the compile marks (step,
function, count, cause).
``rate_text`` and ``hint_line`` are the header's two lines: examples/s with
the MFU, and ``advice: <hint>`` while any rule fires. Tests read these texts
as a user does.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping

from rich.text import Text

from tpudash.advice.report import ADVICE_FILE, AdviceReport, CompileMark
from tpudash.advice.rules import RULE_IDS, Advice
from tpudash.format import format_timestamp, format_value

ADVICE_KEY = "a"
"""The run screens' key that opens the Advice tab (named in the header's hint)."""
STATE_ORDER = ("fires", "not checked", "quiet")
STATE_MARKS = {"fires": ("▲", "bold yellow"), "not checked": ("?", "dim"), "quiet": ("✓", "green")}
FIX_STYLE = "dim cyan"  # the line to change reads as code
RULE_WIDTH = max(len(rule) for rule in RULE_IDS)
MARKS_SHOWN = 12
NO_ADVICE = (
    "No advice recorded for this run: it was recorded before tpudash judged runs ({file}), "
    "or by a job without a model to judge (matmul, gradient descent)."
)
READING = "Reading the run's advice…"
HINT_KEY = f"  ({ADVICE_KEY}: Advice tab)"


def ordered(report: AdviceReport) -> list[Advice]:
    """Every rule: those that fire first, then those not checked, then the quiet ones (``RULE_IDS`` order within)."""
    return sorted(report.advice, key=lambda advice: STATE_ORDER.index(advice.state))


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def mfu_line(report: AdviceReport, width: int = 80) -> Text:
    """``MFU 22.9 %`` (or unknown, and why) with the peak's and the FLOPs' sources."""
    mfu = report.mfu
    if mfu is None:
        return Text("MFU not measured yet: it comes with the run's first epoch", style="dim")
    if mfu.mfu is not None:
        text = Text(mfu.text(), style="bold")
    else:  # why, less what the sources below say
        said = (f"peak unknown: {mfu.peak_source}", f"FLOPs per step unknown: {mfu.flops_source}")
        why = [part for part in mfu.why.split("; ") if part and part not in said]
        text = Text("MFU unknown" + (f": {'; '.join(why)}" if why else ""), style="yellow")
    for label, source in (("peak: ", mfu.peak_source), ("FLOPs per step: ", mfu.flops_source)):
        if source:
            text.append("\n")
            text.append_text(_hanging(Text("  " + label, "dim"), source, "dim", width, 2 + len(label)))
    return text


def counts_line(report: AdviceReport) -> Text:
    """How many rules fire, are not checked and are quiet; what the run ran on; when it was judged."""
    counts = {state: sum(advice.state == state for advice in report.advice) for state in STATE_ORDER}
    words = {"fires": ("fires", "fire"), "not checked": ("not checked", "not checked"), "quiet": ("quiet", "quiet")}
    text = Text()
    for index, state in enumerate(STATE_ORDER):
        count = counts[state]
        if index:
            text.append(" · ", "dim")
        noun = "rule" if count == 1 else "rules"
        style = STATE_MARKS[state][1] if count else "dim"
        text.append(f"{count} {noun} {words[state][0 if count == 1 else 1]}", style)
    where = " · ".join(part for part in (report.framework, "TPU run" if report.on_tpu else "not a TPU run") if part)
    text.append(f"\n{where} · judged {format_timestamp(report.updated)}", "dim")
    return text


def _hanging(head: Text, body: str, style: str, width: int, indent: int) -> Text:
    """``head`` then ``body`` wrapped to ``width``, its later lines indented to ``indent`` cells."""
    lines = textwrap.wrap(body, max(20, width - indent)) or [""]
    text = head.copy()
    text.append(lines[0], style)
    for line in lines[1:]:
        text.append("\n" + " " * indent)
        text.append(line, style)
    return text


def rule_lines(advice: Advice, width: int) -> Text:
    """One rule: mark, id, summary; a firing one's fix under it; a quiet one on one line."""
    mark, mark_style = STATE_MARKS[advice.state]
    indent = 2 + RULE_WIDTH + 2
    head = Text.assemble(
        (f"{mark} ", mark_style), (advice.rule.ljust(RULE_WIDTH) + "  ", "bold" if advice.state == "fires" else "")
    )
    if advice.state == "quiet":
        head.append(clip(advice.summary, max(10, width - indent)), "dim")
        return head
    text = _hanging(head, advice.summary, "yellow" if advice.state == "fires" else "dim", width, indent)
    if advice.state == "fires" and advice.fix:
        text.append("\n")
        text.append_text(_hanging(Text(" " * indent + "fix: ", "dim"), advice.fix, FIX_STYLE, width, indent + 5))
    return text


def mark_line(mark: CompileMark, width: int) -> Text:
    text = Text.assemble(
        (f"  step {mark.step:>6}  ", ""),
        (mark.function, "bold"),
        (f" ×{mark.count}", "yellow" if mark.count > 1 else ""),
    )
    if mark.cause:
        text.append("  " + clip(mark.cause, max(10, width - len(text.plain) - 2)), "dim")
    return text


def marks_text(marks: tuple[CompileMark, ...], width: int) -> Text:
    """The traces and compilations seen, oldest first: step, function, count, cause."""
    text = Text(f"Traces and compilations ({len(marks)})", style="bold")
    for mark in marks[:MARKS_SHOWN]:
        text.append("\n")
        text.append_text(mark_line(mark, width))
    if len(marks) > MARKS_SHOWN:
        text.append(f"\n  … and {len(marks) - MARKS_SHOWN} more", "dim")
    return text


def advice_text(report: AdviceReport, width: int = 80) -> Text:
    """Everything the Advice tab shows of ``report`` at ``width`` cells."""
    rules = Text("\n").join(rule_lines(advice, width) for advice in ordered(report))
    parts = [counts_line(report), rules, mfu_line(report, width)]
    if report.marks:
        parts.append(marks_text(report.marks, width))
    return Text("\n\n").join(parts)


def no_advice_text() -> Text:
    return Text(NO_ADVICE.format(file=ADVICE_FILE), style="dim")


def unreadable_text(error: str) -> Text:
    return Text.assemble(("The run's advice could not be read: ", "bold red"), (error, "red"))


# -- the run header's lines ---------------------------------------------------------------


def mfu_text(report: AdviceReport | None, final_metrics: Mapping[str, float]) -> str | None:
    """The header's MFU: the newest advice.json's, else run.json's ``mfu`` metric (a fraction); else its why."""
    if report is not None and report.mfu is not None and report.mfu.mfu is not None:
        return report.mfu.text()
    value = final_metrics.get("mfu")
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return f"MFU {value * 100:.3g} %"
    if report is not None and report.mfu is not None:
        return "MFU unknown"  # why: in the Advice tab (the header keeps to one line)
    return None


def rate_text(report: AdviceReport | None, final_metrics: Mapping[str, float]) -> Text | None:
    """``1185 examples/s · MFU 22.9 %``: the header's line, None while there is no MFU to say."""
    mfu = mfu_text(report, final_metrics)
    if mfu is None:
        return None
    text = Text()
    for name, unit in (("examples_per_second", "examples/s"), ("steps_per_second", "steps/s")):
        value = final_metrics.get(name)
        if isinstance(value, (int, float)) and math.isfinite(value):
            text.append(f"{format_value(value)} {unit}", "bold")
            text.append(" · ", "dim")
            break
    text.append(mfu, "bold" if not mfu.startswith("MFU unknown") else "dim")
    return text


def hint_line(hint: str, width: int) -> Text:
    """``advice: <hint>  (a: Advice tab)`` in ``width`` cells: the hint is cut, never the key that opens the tab."""
    room = max(10, width - len("advice: ") - len(HINT_KEY))
    return Text.assemble(("advice: ", "bold yellow"), (clip(hint, room), "yellow"), (HINT_KEY, "dim"))
