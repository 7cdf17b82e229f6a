"""A profile's summary drawn as text for the Profile tab (``tpudash.tui.profiletab``); no widget here.

``summary_text`` is everything the tab shows of one capture, fitted to the
pane's width: step time with a bar per step, the breakdown as one stacked
bar in % of the step with its legend (the theme's colours, names and %),
the input pipeline's verdict and slowest tf.data stages, utilisation (a
figure the backend does not measure says so, never 0 %), the top ops with
bars, XProf's recommendations and the command that opens the full trace;
``comparison_lines`` puts two captures' figures side by side. Tests read
these texts as a user does.
"""

from __future__ import annotations

from rich.text import Text

from tpudash.format import format_timestamp
from tpudash.profiles.requests import DEFAULT_PROFILE_STEPS, ProfileAnswer
from tpudash.profiles.summary import CaptureInfo, ProfileSummary

BREAKDOWN_NAMES = {
    "input": "input / infeed",
    "host_compute": "host compute",
    "device_compute": "device compute",
    "collectives": "collectives and device-to-device",
    "compile": "compile",
    "other": "other",
    "idle": "idle",
}
UTILISATION_NAMES = {
    "duty_cycle": "duty cycle",
    "mxu": "MXU",
    "flop_rate_vs_roofline": "FLOP rate vs roofline",
    "memory_bandwidth": "memory bandwidth",
}
# Which of the theme's colours each part of a step is drawn in (and its legend).
BREAKDOWN_THEME = {
    "input": "warning",
    "host_compute": "primary",
    "device_compute": "success",
    "collectives": "accent",
    "compile": "secondary",
    "other": "error",
    "idle": "foreground",
}
FALLBACK_COLORS = {
    "warning": "yellow",
    "primary": "blue",
    "success": "green",
    "accent": "magenta",
    "secondary": "cyan",
    "error": "red",
    "foreground": "white",
}
IDLE_COLOR = "grey50"  # waiting, not working: drawn apart from every part that works
PER_STEP_SHOWN = 20
TOP_OPS_SHOWN = 10
STAGES_SHOWN = 5
LABEL_WIDTH = 28
PARTIAL_BLOCKS = " ▏▎▍▌▋▊▉"
VERDICT_STYLES = {"input-bound": "bold yellow", "not input-bound": "bold green", "unknown": "bold"}


# -- drawing a summary (no widget) ------------------------------------------------------


def bar(fraction: float, width: int) -> str:
    """A bar of ``fraction`` (0–1) of ``width`` cells, in eighths of a cell."""
    eighths = round(max(0.0, min(1.0, fraction)) * max(0, width) * 8)
    whole, part = divmod(eighths, 8)
    return "█" * whole + (PARTIAL_BLOCKS[part] if part else "")


def milliseconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms"


def clip(text: str, width: int) -> str:
    """``text`` in ``width`` cells, its start cut (an op's or a stage's name says most at its end)."""
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def stacked_bar(breakdown: dict[str, float], width: int, colors: dict[str, str]) -> Text:
    """One bar of ``width`` cells, a coloured run per part in proportion to its % of the step."""
    line = Text()
    total = sum(max(0.0, value) for value in breakdown.values()) or 100.0
    done_cells, so_far = 0, 0.0
    for key in BREAKDOWN_NAMES:
        so_far += max(0.0, breakdown.get(key, 0.0))
        end = round(so_far / total * width)
        if end > done_cells:
            line.append("█" * (end - done_cells), style=colors.get(key, ""))
            done_cells = end
    return line


def breakdown_legend(breakdown: dict[str, float], colors: dict[str, str], width: int = 10_000) -> Text:
    """Each part's colour, name and % of the step, on as many lines of ``width`` cells as it takes (never split)."""
    lines: list[Text] = []
    for key, name in BREAKDOWN_NAMES.items():
        item = Text.assemble(("■ ", colors.get(key, "")), f"{name} {breakdown.get(key, 0.0):.1f} %")
        if lines and lines[-1].cell_len + 2 + item.cell_len <= width:
            lines[-1].append("  ")
            lines[-1].append_text(item)
        else:
            lines.append(item)
    return Text("\n").join(lines)


def heading(text: str) -> Text:
    return Text(text, style="bold underline")


def bar_line(
    name: str, fraction: float, bar_width: int, figures: str, style: str, name_width: int = LABEL_WIDTH
) -> Text:
    return Text.assemble(
        clip(name, name_width - 1).ljust(name_width), (bar(fraction, bar_width).ljust(bar_width), style), " ", figures
    )


def summary_text(
    summary: ProfileSummary,
    *,
    width: int,
    command: str,
    colors: dict[str, str] | None = None,
    beside: ProfileSummary | None = None,
) -> Text:
    """The whole summary as the tab shows it, fitted to ``width`` cells (prose wraps in the pane)."""
    colors = colors or {key: FALLBACK_COLORS[theme] for key, theme in BREAKDOWN_THEME.items()}
    width = max(40, width)
    bar_width = max(8, width - LABEL_WIDTH - 22)
    # Ops and tf.data stages have long names (their end says most): half the pane, their bars the rest.
    name_width = max(LABEL_WIDTH, min(72, width // 2))
    named_bar = max(8, width - name_width - 22)
    out: list[Text] = []
    if beside is not None:
        out += comparison_lines(summary, beside)
        out.append(Text())
    times = summary.step_time_ms
    out.append(heading("Step time"))
    out.append(
        Text(
            f"avg {milliseconds(times.get('avg'))} · min {milliseconds(times.get('min'))} · "
            f"max {milliseconds(times.get('max'))} · σ {milliseconds(times.get('std'))}   "
            f"{summary.steps} steps, {summary.framework} on {summary.hardware or 'an unnamed device'}"
        )
    )
    longest = max((step["total_ms"] for step in summary.per_step), default=0.0) or 1.0
    for step in summary.per_step[:PER_STEP_SHOWN]:
        out.append(
            bar_line(
                f"step {step['step']}", step["total_ms"] / longest, bar_width, milliseconds(step["total_ms"]), "cyan"
            )
        )
    if len(summary.per_step) > PER_STEP_SHOWN:
        out.append(Text(f"(+{len(summary.per_step) - PER_STEP_SHOWN} more steps)", style="dim"))
    out.append(Text())
    out.append(heading("Where a step's time goes (% of the average step)"))
    out.append(stacked_bar(summary.breakdown, width - 2, colors))
    out.append(breakdown_legend(summary.breakdown, colors, width - 2))
    out.append(Text())
    verdict = Text.assemble(("Input pipeline: ", "bold"), (summary.verdict, VERDICT_STYLES.get(summary.verdict, "")))
    if summary.input_percent is not None:
        verdict.append(f" (input {summary.input_percent:.1f} % of the step)")
    out.append(verdict)
    if summary.input_conclusion:
        out.append(Text(summary.input_conclusion))
    if summary.input_stages:
        out.append(Text("slowest tf.data stages:", style="dim"))
        slowest = max(stage["self_ms"] for stage in summary.input_stages) or 1.0
        for stage in summary.input_stages[:STAGES_SHOWN]:
            figures = f"{milliseconds(stage['self_ms'])} {stage['self_percent']:.1f} %"
            out.append(bar_line(stage["name"], stage["self_ms"] / slowest, named_bar, figures, "yellow", name_width))
    out.append(Text())
    out.append(heading("Utilisation"))
    for key, name in UTILISATION_NAMES.items():
        figure = summary.utilisation.get(key, {})
        percent = figure.get("percent")
        value = Text(figure.get("note") or "not measured", style="dim") if percent is None else Text(f"{percent:.1f} %")
        out.append(Text.assemble(name.ljust(LABEL_WIDTH), value))
    out.append(Text())
    source = f" ({summary.top_ops_source})" if summary.top_ops_source else ""
    out.append(heading(f"Top ops by self time{source}"))
    if not summary.top_ops:
        out.append(Text("XProf named no ops for this capture.", style="dim"))
    top = max((op["self_percent"] for op in summary.top_ops), default=0.0) or 1.0
    for op in summary.top_ops[:TOP_OPS_SHOWN]:
        name = op["name"] if not op["type"] or op["type"] in op["name"] else f"{op['name']} ({op['type']})"
        figures = f"{op['self_percent']:.1f} % {milliseconds(op['self_ms'])}"
        out.append(bar_line(name, op["self_percent"] / top, named_bar, figures, "magenta", name_width))
    out.append(Text())
    out.append(heading("What XProf recommends"))
    if summary.bottleneck:
        out.append(Text(summary.bottleneck))
    for recommendation in summary.recommendations:
        out.append(Text("• " + recommendation))
    if not summary.bottleneck and not summary.recommendations:
        out.append(Text("XProf gave no recommendation for this capture.", style="dim"))
    for note in summary.notes:
        out.append(Text("note: " + note, style="dim"))
    out.append(Text())
    out.append(Text.assemble(("The full trace: ", "bold"), (command, "bold cyan")))
    out.append(Text(f"capture {summary.capture} · {', '.join(summary.hosts)} · {summary.tool}", style="dim"))
    return Text("\n").join(out)


def difference(before: float | None, after: float | None, unit: str) -> str:
    if before is None or after is None:
        return "–"
    change = after - before
    relative = f" ({change / before * 100:+.0f} %)" if unit == " ms" and before else ""
    return f"{change:+.2f}{unit}{relative}"


def comparison_lines(shown: ProfileSummary, beside: ProfileSummary) -> list[Text]:
    """Two captures' step time and breakdown in columns (the one beside first), and what changed from it."""
    column, label_width = 22, 34
    lines = [
        heading("Side by side"),
        Text.assemble(
            "".ljust(label_width),
            (clip(beside.capture, column - 1).ljust(column), "bold"),
            (clip(shown.capture, column - 1).ljust(column), "bold"),
            ("difference", "bold"),
        ),
    ]
    rows: list[tuple[str, float | None, float | None, str]] = [
        (f"step time {name}", beside.step_time_ms.get(key), shown.step_time_ms.get(key), " ms")
        for key, name in (("avg", "avg"), ("min", "min"), ("max", "max"), ("std", "σ"))
    ]
    rows += [(name, beside.breakdown.get(key), shown.breakdown.get(key), " %") for key, name in BREAKDOWN_NAMES.items()]
    for label, before, after, unit in rows:

        def as_text(value: float | None, unit: str = unit) -> str:
            if value is None:
                return "–"
            return milliseconds(value) if unit == " ms" else f"{value:.1f} %"

        lines.append(
            Text(
                clip(label, label_width - 1).ljust(label_width)
                + as_text(before).ljust(column)
                + as_text(after).ljust(column)
                + difference(before, after, unit)
            )
        )
    return lines


def capture_label(info: CaptureInfo) -> str:
    when = format_timestamp(info.started_at) if info.started_at else info.name
    hosts = ", ".join(info.hosts) or "no host yet"
    return f"{when}  {info.name}  ({hosts}{'' if info.has_summary else ', not converted yet'})"


def steps(answer: ProfileAnswer) -> str:
    """``6–10``: the steps an answer says were (or are being) captured."""
    if answer.first_step is None:
        return "(not known yet)"
    last = answer.last_step if answer.last_step is not None else answer.first_step + DEFAULT_PROFILE_STEPS - 1
    return f"{answer.first_step}–{last}"
