"""The converter: ``python -m tpudash.profiles.xprof_child <capture_dir> [--framework F] [--parent PID]``.

The only module that imports xprof, and no module imports it: the parent
(``convert.convert_capture``) runs it with a time bound and reads its stderr,
where xprof's C++ logs. It converts a capture's ``*.xplane.pb`` (one per host)
with XProf's ``overview_page``, ``input_pipeline_analyzer`` and
``framework_op_stats`` tools, writes ``<capture_dir>/summary.json`` (the shape
``summary.ProfileSummary`` checks) and prints one JSON line on stdout:
``{"summary": path}``. Where XProf gives no op stats (JAX on XLA:CPU), the ops'
self time is added up from the capture's trace events (``trace_viewer``).

XProf keeps cache files beside the xplane files it reads, so it is given
links to them in a temporary folder: the capture folder gets summary.json only.

Exit status: 0 done; 3 xprof cannot be imported; 4 no ``*.xplane.pb`` in the folder; 5 XProf
could not read the capture (its reason on stderr); anything else a crash (its traceback on stderr).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

EXIT_NO_XPROF = 3
EXIT_NO_XPLANE = 4
EXIT_NOTHING_CONVERTED = 5
TOP_OPS = 10
INPUT_STAGES = 5
MAX_STEPS_KEPT = 1000
NOT_ON_CPU = "not measured on CPU"
NO_STEP_MARKER_NOTE = (
    "No step marker observed in the capture: XProf cannot split its time into steps, so there is no step time, "
    "breakdown or input verdict (tpudash's writers mark steps; a loop of your own needs "
    'tf.profiler.experimental.Trace("train", step_num=n, _r=1) or jax.profiler.StepTraceAnnotation("train", step_num=n))'
)
OP_STATS_SOURCE = "xprof framework_op_stats ({side})"
TRACE_SOURCE = "trace events (XLA:CPU gives no op stats)"
UTILISATION_FIELDS = {
    "duty_cycle": "device_duty_cycle_percent",
    "mxu": "mxu_utilization_percent",
    "flop_rate_vs_roofline": "flop_rate_utilization_relative_to_roofline",
    "memory_bandwidth": "memory_bw_utilization_relative_to_hw_limit",
}
# XProf's per-step columns, summed into the breakdown's parts (in % of the average step).
BREAKDOWN_COLUMNS = {
    "input": ("infeedTimeMs", "outfeedTimeMs"),
    "host_compute": ("hostComputeTimeMs", "kernelLaunchTimeMs"),
    "device_compute": ("deviceComputeTimeMs",),
    "collectives": ("deviceCollectivesTimeMs", "deviceToDeviceTimeMs"),
    "compile": ("compileTimeMs",),
    "other": ("otherTimeMs",),
}
PER_STEP_COLUMNS = {
    "input_ms": ("infeedTimeMs", "outfeedTimeMs"),
    "host_compute_ms": ("hostComputeTimeMs", "kernelLaunchTimeMs"),
    "device_compute_ms": ("deviceComputeTimeMs",),
    "collectives_ms": ("deviceCollectivesTimeMs", "deviceToDeviceTimeMs"),
    "compile_ms": ("compileTimeMs",),
    "other_ms": ("otherTimeMs",),
}
STATEMENT_FIELDS = (
    "kernel_launch_statement",
    "all_other_statement",
    "device_collectives_statement",
    "precision_statement",
)
LINK = re.compile(r"""<a\s[^>]*href=["']([^"']*)["'][^>]*>(.*?)</a>""", re.IGNORECASE | re.DOTALL)
TAG = re.compile(r"<[^>]+>")


class NothingConverted(Exception):
    """An XProf tool returned nothing: it could not read the capture (its reason is on stderr, from C++)."""


def plain_text(text: object) -> str:
    """XProf's HTML as text: a link becomes ``words (address)``, other tags go, entities are decoded."""
    if not isinstance(text, str):
        return ""
    text = LINK.sub(lambda match: f"{match.group(2)} ({match.group(1)})", text)
    return " ".join(html.unescape(TAG.sub("", text)).split())


def _table_rows(table: dict) -> list[dict[str, Any]]:
    """A DataTable's rows as {column id: value}."""
    ids = [column.get("id") for column in table.get("cols", [])]
    return [
        {name: cell.get("v") if isinstance(cell, dict) else None for name, cell in zip(ids, row.get("c", []))}
        for row in table.get("rows", [])
    ]


def _find_table(tables: Any, wanted: str) -> dict:
    """The first of XProf's tables with a property or column named ``wanted``; {} when none has."""
    for table in tables if isinstance(tables, list) else [tables]:
        if not isinstance(table, dict):
            continue
        if wanted in (table.get("p") or {}) or any(column.get("id") == wanted for column in table.get("cols", [])):
            return table
    return {}


def _number(value: object) -> float:
    try:
        number = float(str(value).rstrip("%")) if isinstance(value, str) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def _percent(value: float) -> float:
    return round(min(100.0, max(0.0, value)), 2)


def step_label(name: object) -> str:
    """``"train 7"`` → ``"7"`` (the step number the marker gave); another name as it is."""
    text = str(name or "")
    last = text.rsplit(" ", 1)[-1]
    return last if last.isdigit() else text[:200]


def host_collectives_note(ops: list[dict[str, Any]], breakdown: dict[str, float]) -> list[str]:
    """Why a collective among the top ops shows as 0 % collectives: on a CPU, XProf files it under host compute.

    Seen on the 8 CPU replicas of a MirroredStrategy: the all-reduce leads the ops, the breakdown says 0 %.
    """
    collectives = [op["name"] for op in ops if "collective" in f"{op.get('type', '')} {op['name']}".lower()]
    if not collectives or breakdown.get("collectives", 0.0) > 0.0:
        return []
    return [
        f"Collectives run on the host here ({collectives[0]} is among the top ops): XProf counts them as "
        "host compute, so the breakdown's collectives stay at 0 %."
    ]


def summarize_steps(overview: Any) -> dict[str, Any]:
    """Step time, the per-step breakdown and XProf's verdict from the overview page."""
    table = _find_table(overview, "steptime_ms_average")
    properties = table.get("p") or {}
    rows = _table_rows(table)
    per_step = [
        {
            "step": step_label(row.get("stepnum")),
            "total_ms": round(_number(row.get("stepTimeMs")), 3),
            **{
                key: round(sum(_number(row.get(column)) for column in columns), 3)
                for key, columns in PER_STEP_COLUMNS.items()
            },
        }
        for row in rows
    ]
    totals = [round(_number(row.get("stepTimeMs")), 3) for row in rows]
    average = statistics.fmean(totals) if totals else 0.0
    breakdown = dict.fromkeys(("input", "host_compute", "device_compute", "collectives", "compile", "other"), 0.0)
    if average > 0:
        for part, columns in BREAKDOWN_COLUMNS.items():
            spent = statistics.fmean(sum(_number(row.get(column)) for column in columns) for row in rows)
            breakdown[part] = _percent(100.0 * spent / average)
    breakdown["idle"] = _percent(100.0 - sum(breakdown.values())) if average > 0 else 0.0
    step_time: dict[str, float | None] = dict.fromkeys(("avg", "min", "max", "std"), None)
    if totals:
        step_time = {
            "avg": round(average, 3),
            "min": round(min(totals), 3),
            "max": round(max(totals), 3),
            "std": round(statistics.pstdev(totals), 3),
        }
    conclusion = plain_text(properties.get("input_conclusion"))
    if not totals:
        verdict, input_percent = "unknown", None
    else:
        input_percent = breakdown["input"]
        # XProf's own words decide: HIGHLY or MODERATELY input-bound is input-bound. POTENTIALLY is its guess
        # from "All others" time (Python, I/O) with no input time measured: not called input-bound here.
        words = conclusion.lower()
        if "highly input-bound" in words or "moderately input-bound" in words:
            verdict = "input-bound"
        elif "input-bound" in words:
            verdict = "not input-bound"
        else:
            verdict = "input-bound" if input_percent >= 20.0 else "not input-bound"
    return {
        "hardware": str(properties.get("hardware_type") or "unknown")[:200],
        "steps": len(per_step),
        "step_time_ms": step_time,
        "per_step": per_step[:MAX_STEPS_KEPT],
        "breakdown": breakdown,
        "input_percent": input_percent,
        "verdict": verdict,
        "input_conclusion": conclusion,
        "next_step": plain_text(properties.get("summary_nextstep")),
    }


def summarize_advice(overview: Any, input_pipeline: Any, conclusion: str) -> tuple[str, list[str]]:
    """XProf's bottleneck statement(s) and its recommendations (next step, tips, tf.data advice) as plain text.

    The statements leave out the input conclusion (a field of its own); with none left, XProf's word for
    where the bottleneck is ("host", "device") is said.
    """
    table = _find_table(overview, "statement")
    properties = table.get("p") or {}
    statements = [plain_text(properties.get("statement"))]
    statements += [plain_text(properties.get(name)) for name in STATEMENT_FIELDS]
    bottleneck = " ".join(dict.fromkeys(text for text in statements if text and text != conclusion))
    where = plain_text(properties.get("bottleneck"))
    if not bottleneck and where and where.lower() not in ("no", "unknown"):
        bottleneck = f"XProf's bottleneck: {where}"
    recommendations: list[str] = []
    for row in _table_rows(table):
        link, description = plain_text(row.get("link")), plain_text(row.get("description"))
        if link:
            recommendations.append(f"{description}: {link}" if description else link)
    for row in _table_rows(_find_table(input_pipeline, "link")):
        advice = plain_text(row.get("link"))
        if advice:
            recommendations.append(advice)
    return bottleneck, list(dict.fromkeys(recommendations))[:60]


def summarize_utilisation(overview: Any, hardware: str) -> dict[str, dict[str, Any]]:
    """The device's utilisation figures; on CPU none is measured (XProf reports 0 %, which would read as idle)."""
    properties = _find_table(overview, "device_duty_cycle_percent").get("p") or {}
    on_cpu = hardware.upper().startswith("CPU")
    figures: dict[str, dict[str, Any]] = {}
    for key, name in UTILISATION_FIELDS.items():
        if on_cpu or name not in properties:
            figures[key] = {"percent": None, "note": NOT_ON_CPU if on_cpu else "not reported by XProf"}
        else:
            figures[key] = {"percent": _percent(_number(properties[name])), "note": None}
    return figures


def summarize_input_stages(input_pipeline: Any) -> list[dict[str, Any]]:
    """The slowest tf.data stages by self time (XProf gives their share as a fraction of all input time)."""
    rows = _table_rows(_find_table(input_pipeline, "opName"))
    rows.sort(key=lambda row: _number(row.get("selfTimeInMs")), reverse=True)
    return [
        {
            "name": str(row.get("opName"))[:500],
            "self_ms": round(_number(row.get("selfTimeInMs")), 3),
            "self_percent": _percent(100.0 * _number(row.get("selfTimeInPercent"))),
        }
        for row in rows[:INPUT_STAGES]
        if row.get("opName")
    ]


def op_stats_top_ops(op_stats: Any) -> tuple[list[dict[str, Any]], str]:
    """The top ops by self time from ``framework_op_stats`` (device ops where there are any, else host ops)."""
    tables = op_stats if isinstance(op_stats, list) else [op_stats]
    rows = [
        row
        for table in tables[-1:]  # the last table leaves IDLE out; the first has it
        if isinstance(table, dict)
        for row in _table_rows(table)
        if row.get("type") != "IDLE" and row.get("operation")
    ]
    device = [row for row in rows if str(row.get("host_or_device")).lower() == "device"]
    side, chosen = ("device", device) if device else ("host", rows)
    percent_column = f"{side}_total_self_time_percent"
    chosen.sort(key=lambda row: _number(row.get("total_self_time")), reverse=True)
    ops = [
        {
            "name": str(row.get("operation"))[:500],
            "type": str(row.get("type") or "")[:500],
            "self_percent": _percent(100.0 * _number(row.get(percent_column))),
            "self_ms": round(_number(row.get("total_self_time")) / 1000.0, 3),  # XProf gives µs
        }
        for row in chosen[:TOP_OPS]
    ]
    return ops, OP_STATS_SOURCE.format(side=side)


def trace_top_ops(trace: dict) -> list[dict[str, Any]]:
    """The top ops by self time added up from complete trace events (each event's time less its children's).

    Where the trace has XLA's ops (events with an ``hlo_op``), only they are ranked: the runtime's own
    events (thread pools waiting, the executor, Python's frames) would otherwise lead. Without them, every
    event but Python's frames (``$file:line``) is.
    """
    events = [event for event in trace.get("traceEvents", []) if isinstance(event, dict) and event.get("ph") == "X"]
    with_hlo = any("hlo_op" in (event.get("args") or {}) for event in events)
    by_thread: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
    for event in events:
        arguments = event.get("args") or {}
        if "dur" not in event or "step_num" in arguments or "step_name" in arguments:
            continue  # a step marker spans the step: it is not an op
        name = str(event.get("name", ""))
        ranked = "hlo_op" in arguments if with_hlo else not name.startswith("$")
        start, duration = _number(event.get("ts")), _number(event.get("dur"))
        # Events not ranked still nest: their time is not their children's self time.
        by_thread[event.get("pid"), event.get("tid")].append((start, duration, name if ranked else ""))
    self_time: dict[str, float] = defaultdict(float)
    for spans in by_thread.values():
        spans.sort(key=lambda span: (span[0], -span[1]))  # a parent before the children it starts with
        open_events: list[list[Any]] = []  # [end, name, time of its children, duration], innermost last
        for start, duration, name in spans:
            while open_events and open_events[-1][0] <= start:
                _close(open_events, self_time)
            open_events.append([start + duration, name, 0.0, duration])
        while open_events:
            _close(open_events, self_time)
    self_time.pop("", None)  # the events not ranked
    total = sum(self_time.values())
    leaders = sorted(self_time.items(), key=lambda item: item[1], reverse=True)[:TOP_OPS]
    return [
        {
            "name": name[:500],
            "type": re.sub(r"\.\d+$", "", name.split(":")[0])[:500],
            "self_percent": _percent(100.0 * spent / total) if total else 0.0,
            "self_ms": round(spent / 1000.0, 3),  # trace events are in µs
        }
        for name, spent in leaders
    ]


def _close(open_events: list[list[Any]], self_time: dict[str, float]) -> None:
    end, name, children, duration = open_events.pop()
    self_time[name] += max(0.0, duration - children)
    if open_events:
        open_events[-1][2] += duration


def guess_framework(ops: list[dict[str, Any]], trace_names: set[str]) -> str:
    names = " ".join(op["name"] for op in ops) + " " + " ".join(trace_names)
    if "PjitFunction" in names or "jit_" in names:
        return "jax"
    if ops:
        return "tensorflow"
    return "unknown"


def convert(capture_dir: Path, framework: str | None) -> dict[str, Any]:
    """The summary of the capture in ``capture_dir`` (see the module's docstring)."""
    from importlib.metadata import version

    from xprof.convert.raw_to_tool_data import xspace_to_tool_data

    xplanes = sorted(capture_dir.glob("*.xplane.pb"))
    hosts = [path.name[: -len(".xplane.pb")] for path in xplanes]
    started = time.perf_counter()
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tpudash-xprof-") as scratch:
        # XProf writes its caches beside the files it reads: links in a folder of our own keep the capture clean.
        linked = []
        for path in xplanes:
            link = Path(scratch, path.name)
            link.symlink_to(path.resolve())
            linked.append(str(link))

        def tool(name: str) -> Any:
            data, _ = xspace_to_tool_data(linked, name, {"use_saved_result": False})
            if not data:
                raise NothingConverted(f"XProf's {name} gave nothing for this capture (is each .xplane.pb whole?)")
            return json.loads(data)

        overview = tool("overview_page")
        input_pipeline = tool("input_pipeline_analyzer")
        ops, source = op_stats_top_ops(tool("framework_op_stats"))
        trace_names: set[str] = set()
        if not ops:
            try:
                trace = tool("trace_viewer")
            except NothingConverted:
                trace = {}
            trace_names = {str(event.get("name")) for event in trace.get("traceEvents", [])[:20000]}
            ops, source = trace_top_ops(trace), TRACE_SOURCE
            notes.append("XProf gives no op statistics for this capture: the top ops are self times from its trace.")
    steps = summarize_steps(overview)
    bottleneck, recommendations = summarize_advice(overview, input_pipeline, steps["input_conclusion"])
    next_step = steps.pop("next_step")
    if next_step:
        recommendations.insert(0, next_step)
    if steps["verdict"] == "unknown":
        notes.insert(0, NO_STEP_MARKER_NOTE)
    elif "potentially input-bound" in steps["input_conclusion"].lower():
        notes.append(
            "XProf calls the program POTENTIALLY input-bound from its 'All others' time (Python, I/O), not from "
            f"measured input time ({steps['input_percent']:.1f} % of the step): the verdict here is not input-bound."
        )
    if steps["steps"] > MAX_STEPS_KEPT:
        notes.append(f"per_step keeps the first {MAX_STEPS_KEPT} of {steps['steps']} steps")
    if len(hosts) > 1:
        notes.append(f"{len(hosts)} hosts' captures, combined by XProf")
    hardware = steps["hardware"]
    if hardware.upper().startswith("CPU"):
        notes.append("On CPU XProf measures host time only: device utilisation is not measured.")
        notes.extend(host_collectives_note(ops, steps["breakdown"]))
    return {
        "version": 1,
        "capture": capture_dir.name,
        "hosts": hosts,
        "framework": framework or guess_framework(ops, trace_names),
        **steps,
        "bottleneck": bottleneck,
        "recommendations": recommendations[:60],
        "utilisation": summarize_utilisation(overview, hardware),
        "top_ops": ops,
        "top_ops_source": source,
        "input_stages": summarize_input_stages(input_pipeline),
        "notes": notes,
        "tool": f"xprof {version('xprof')}",
        "convert_seconds": round(time.perf_counter() - started, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpudash.profiles.xprof_child")
    parser.add_argument("capture_dir", type=Path)
    parser.add_argument("--framework", choices=("tensorflow", "jax", "unknown"))
    parser.add_argument("--parent", type=int, help="the parent's pid: the converter dies with it (Linux)")
    arguments = parser.parse_args(argv)
    from tpudash.childproc import claim_stdout, parent_death_signal

    if arguments.parent is not None:
        # Set here, not as the parent's preexec_fn (unsafe in a parent with threads, as the dashboard is).
        die_with_parent = parent_death_signal(signal.SIGKILL, expected_parent=arguments.parent)
        if die_with_parent is not None:
            die_with_parent()

    answer = claim_stdout()  # xprof and its C++ may print: stdout carries the one answer line only
    capture_dir: Path = arguments.capture_dir
    if not any(capture_dir.glob("*.xplane.pb")):
        print(f"no *.xplane.pb in {capture_dir}", file=sys.stderr)
        return EXIT_NO_XPLANE
    try:
        import xprof.convert.raw_to_tool_data  # noqa: F401
    except ImportError as error:
        print(f"xprof cannot be imported: {error}", file=sys.stderr)
        return EXIT_NO_XPROF
    try:
        summary = convert(capture_dir, arguments.framework)
    except NothingConverted as error:
        print(error, file=sys.stderr)
        return EXIT_NOTHING_CONVERTED
    target = capture_dir / "summary.json"
    partial = capture_dir / f".summary.json.{os.getpid()}"
    partial.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, target)  # a reader sees the old summary or the new one, never half
    answer.write(json.dumps({"summary": str(target), "convert_seconds": summary["convert_seconds"]}) + "\n")
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
