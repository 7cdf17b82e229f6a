"""The advice of one live run: judged once at its start, then from counters at every epoch's end.

``RunAdvisor`` is what a run's writer (the Keras callback, the engine's train
job) holds: ``start`` judges what the run already knows — the model's
dimensions and batch (``padding``, ``small-batch``), its dtype policy
(``mixed-precision``), the tf.data pipeline handed to it (the six pipeline
rules) — and starts counting the step's FLOPs on a thread of its own, at the
lowest CPU priority, so the training never waits for it (on a TPU host the
host CPU is idle while the chips compute; on a CPU the count takes what the
training leaves). ``epoch_end`` adds what counters say: traces and
compilations (``tpudash.advice.compiles``) and MFU from the epoch's steps/s.
Each replaces ``advice.json`` (``tpudash.advice.report``) whole. Nothing here
raises into the training: a rule that cannot be judged says why.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tpudash.advice.flops import FlopsCount, step_flops_keras_jax, step_flops_keras_tf
from tpudash.advice.mfu import Mfu, PeakFlops, measured_peak_flops, tpu_chips, tpu_peak_flops
from tpudash.advice.pipeline import PIPELINE_RULES, advise_pipeline
from tpudash.advice.report import MAX_COMPILE_MARKS, AdviceReport, CompileMark, write_report
from tpudash.advice.rules import Advice, mixed_precision, not_checked, padding, small_batch

# How many of the newest matmul checks are read for a CPU or GPU run's peak: a run's start never reads a
# whole runs directory.
MATMUL_CHECKS_READ = 5
# How a Keras model's step is counted, by the framework it runs on (the run's runtime's ``backend``).
KERAS_FLOPS: dict[str, Callable[[Any, int], FlopsCount]] = {
    "tensorflow": step_flops_keras_tf,
    "jax": step_flops_keras_jax,
}
# The FLOPs count runs at this niceness (Linux: per thread): it takes only the CPU the training leaves.
COUNTING_NICENESS = 19
# At the run's end the count, if still running, has the CPU to itself: its summary waits this long for it.
FINISH_WAITS_FOR_COUNT_SECONDS = 10.0
INPUT_BOUND_WHY = "judged where telemetry and profiles are read: the run view's Advice tab and `tpudash advise`"


def run_peak(store: Any, runtime: Mapping[str, Any]) -> PeakFlops:
    """The peak MFU is measured against: a TPU's published bf16 peak × chips, else the matmul check's measured one."""
    kind = runtime.get("kind")
    if kind == "TPU":
        device_kind = runtime.get("device_kind") or os.environ.get("TPU_ACCELERATOR_TYPE")
        devices = runtime.get("num_replicas") or len(runtime.get("devices") or ()) or 1
        return tpu_peak_flops(device_kind, tpu_chips(device_kind, int(devices)))
    if kind not in ("CPU", "GPU"):
        return PeakFlops(None, f"no peak for a run on {kind or 'an unknown device'}")
    try:
        checks = [run_id for run_id in store.run_ids() if "-matmul-" in run_id][-MATMUL_CHECKS_READ:]
        host = runtime.get("host")
        for run_id in reversed(checks):  # newest first
            info = store.info(run_id)
            same_host = host is None or getattr(info, "host", None) in (host, None)
            if info.status in ("done", "failed") and same_host:
                peak = measured_peak_flops(info)
                if peak.known:
                    return peak
    except Exception as error:  # noqa: BLE001 - an unreadable runs directory costs the peak, never the run
        return PeakFlops(None, f"the matmul checks could not be read: {type(error).__name__}: {error}")
    return PeakFlops(None, "no matmul check of this host in the runs directory: run `tpudash run matmul` once")


def compile_watch(framework: str, model: Any = None) -> Any:
    """The run's recompile watch: a Keras model's TensorFlow step functions' traces, or JAX's compilations.

    None where nothing can be counted (a TensorFlow loop without a Keras model: its tf.functions are the
    user's own); the ``recompiles`` rule then says so.
    """
    from tpudash.advice.compiles import JaxCompileCounter, RecompileWatch, TfTraceCounter

    if framework == "tensorflow" and model is not None:
        return RecompileWatch(TfTraceCounter(model))
    if framework == "jax":
        return RecompileWatch(JaxCompileCounter().start())
    return None


def peak_json(peak: PeakFlops) -> dict[str, Any]:
    """What run.json's ``runtime["mfu_peak"]`` holds."""
    return {"flops_per_second": peak.flops_per_second, "source": peak.source}


def kernel_shapes(model: Any) -> list[tuple[int, ...]]:
    """The matmul shapes of a Keras model's weights: (in, out) of a dense kernel, (h·w·in, out) of a convolution's."""
    shapes: list[tuple[int, ...]] = []
    for weight in getattr(model, "trainable_weights", None) or ():
        shape = tuple(int(d or 0) for d in getattr(weight, "shape", ()))
        if len(shape) == 2:
            shapes.append(shape)
        elif len(shape) > 2:  # a convolution: its im2col matmul
            inner = 1
            for dim in shape[:-1]:
                inner *= dim
            shapes.append((inner, shape[-1]))
    return shapes


def dtype_policy(model: Any) -> str | None:
    policy = getattr(model, "dtype_policy", None)
    return getattr(policy, "name", None) if policy is not None else None


class RunAdvisor:
    """One run's advice; see the module docstring. ``files`` is the run's ``RunFiles``."""

    def __init__(
        self,
        files: Any,
        run_id: str,
        runtime: Mapping[str, Any],
        peak: PeakFlops,
        *,
        log: Callable[[str, str], None] | None = None,
    ) -> None:
        self.files = files
        self.run_id = run_id
        self.framework = str(runtime.get("backend") or "")
        self.on_tpu = runtime.get("kind") == "TPU"
        self.replicas = max(1, int(runtime.get("num_replicas") or 1))
        self.peak = peak
        self._log = log
        self._found: dict[str, Advice] = {}
        self._flops: FlopsCount | None = None
        self._counting: threading.Thread | None = None
        self._mfu: Mfu | None = None
        self._marks: list[CompileMark] = []
        self._watch: Any = None
        self._steps_per_second: list[float] = []
        self._rate_mark = (0, time.perf_counter())
        """(step, time) at the last epoch's end: what a caller's steps/s is measured from when it gives none."""
        self.report: AdviceReport | None = None
        self.write_error: Exception | None = None

    # -- the run's start -----------------------------------------------------------------------
    def start(
        self,
        *,
        model: Any = None,
        dataset: Any = None,
        no_dataset_why: str = "no tf.data dataset seen",
        global_batch: int | None = None,
        count_flops: bool = True,
        count_compiles: bool = True,
    ) -> AdviceReport:
        """Judge what the run knows now, start counting FLOPs, write advice.json; never raises."""
        batch_per_core = global_batch // self.replicas if global_batch else None
        found: list[Advice] = []
        judges: dict[str, Callable[[], Advice]] = {
            "padding": lambda: padding(kernel_shapes(model), batch_per_core, self.on_tpu),
            "small-batch": lambda: small_batch(batch_per_core, self.on_tpu),
            "mixed-precision": lambda: mixed_precision(dtype_policy(model), self.on_tpu),
        }
        for rule, judge in judges.items():
            if model is None and rule != "small-batch":
                found.append(not_checked(rule, "no model seen"))
            else:
                found.append(_judged(rule, judge))
        if dataset is not None:
            try:
                found.extend(advise_pipeline(dataset))
            except Exception as error:  # noqa: BLE001 - a pipeline that cannot be walked is said, never raised
                found.extend(not_checked(r, f"{type(error).__name__}: {error}") for r in PIPELINE_RULES)
        else:
            found.extend(not_checked(r, no_dataset_why) for r in PIPELINE_RULES)
        found.append(not_checked("input-bound", INPUT_BOUND_WHY))
        try:
            self._watch = compile_watch(self.framework, model) if count_compiles else None
        except Exception:  # noqa: BLE001 - a counter that cannot start costs the rule, never the run
            self._watch = None
        watch = self._watch
        found.append(
            not_checked("recompiles", "counted from the first epoch's end")
            if watch is not None
            else not_checked("recompiles", f"{self.framework or 'this framework'} does not report traces here")
        )
        self._found = {a.rule: a for a in found}
        if count_flops and model is not None and global_batch and self.framework in KERAS_FLOPS:
            # Not a daemon: a process leaving while TensorFlow lowers the step on this thread could abort in
            # TensorFlow's C++; exit waits for the count instead (well under a second once training is over).
            self._counting = threading.Thread(
                target=self._count_flops, args=(model, global_batch), name="tpudash-flops", daemon=False
            )
            self._counting.start()
        elif self._flops is not None:
            pass  # counted by the caller (``set_flops``)
        elif self.framework not in KERAS_FLOPS:
            self._flops = FlopsCount(
                None, f"FLOPs per step are counted for Keras on TensorFlow or JAX here, not {self.framework}"
            )
        else:
            self._flops = FlopsCount(None, "no model or batch size seen" if count_flops else "not counted (asked)")
        self._mfu = Mfu.of(self._flops or FlopsCount(None, "being counted"), None, self.peak)
        self._rate_mark = (0, time.perf_counter())
        return self._write()

    def _count_flops(self, model: Any, global_batch: int) -> None:
        try:  # Linux niceness is per thread: the count takes only CPU the training leaves
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COUNTING_NICENESS)
        except (OSError, AttributeError):
            pass
        self._flops = KERAS_FLOPS[self.framework](model, global_batch)

    # -- every epoch's end ----------------------------------------------------------------------
    def epoch_end(self, epoch: int, step: int, steps_per_second: float | None = None) -> AdviceReport:
        """Add the epoch's compile marks and MFU; write advice.json; never raises.

        ``steps_per_second`` None: measured here, from ``step`` and the time since the last epoch's end.
        """
        now = time.perf_counter()
        if steps_per_second is None and step > self._rate_mark[0] and now > self._rate_mark[1]:
            steps_per_second = (step - self._rate_mark[0]) / (now - self._rate_mark[1])
        self._rate_mark = (step, now)
        if self._watch is not None:
            try:
                new = [m for m in self._watch.epoch_end(epoch, step) if m.count > 1]  # a first trace is no recompile
                self._marks.extend(new[: max(0, MAX_COMPILE_MARKS - len(self._marks))])
                for mark in new:
                    self._say(f"recompiled {mark.function} ({mark.count}): {mark.cause or 'cause not said'}")
                self._found["recompiles"] = self._watch.advice()
            except Exception as error:  # noqa: BLE001 - a counter that breaks costs the rule, never the run
                self._found["recompiles"] = not_checked("recompiles", f"{type(error).__name__}: {error}")
                self._watch = None
        if steps_per_second is not None:
            self._steps_per_second.append(steps_per_second)
        self._mfu = Mfu.of(self._flops_so_far(), steps_per_second, self.peak)
        return self._write()

    def _flops_so_far(self) -> FlopsCount:
        return self._flops or FlopsCount(None, "still being counted (at low priority, off the training thread)")

    def close(self) -> None:
        """Stop counting compilations (JAX's listener is process-wide); idempotent, never raises."""
        stop = getattr(getattr(self._watch, "counter", None), "stop", None)
        if stop is not None:
            try:
                stop()
            except Exception:  # noqa: BLE001 - the run ends whatever the counter does
                pass

    def set_flops(self, flops: FlopsCount) -> None:
        """FLOPs per step counted by the caller (a JAX loop's ``step_flops_jax``)."""
        self._flops = flops

    def finish(self) -> dict[str, Any]:
        """What run.json's summary keeps: ``{"mfu": Mfu.to_json()}`` over the steady epochs (the first traces).

        Waits for a FLOPs count still running, at most ``FINISH_WAITS_FOR_COUNT_SECONDS`` (the training is
        over: the count has the CPU). Writes advice.json once more with it. Empty when the run never started.
        """
        self.close()
        if self._mfu is None:
            return {}
        if self._counting is not None:
            self._counting.join(FINISH_WAITS_FOR_COUNT_SECONDS)
        steady = self._steps_per_second[1:] or self._steps_per_second
        self._mfu = Mfu.of(self._flops_so_far(), sum(steady) / len(steady) if steady else None, self.peak)
        self._write()
        return {"mfu": self._mfu.to_json()}

    @property
    def mfu(self) -> Mfu | None:
        return self._mfu

    def _say(self, text: str) -> None:
        if self._log is not None:
            self._log(text, "warning")

    def _write(self) -> AdviceReport:
        report = AdviceReport.of(
            self.run_id,
            list(self._found.values()),
            mfu=self._mfu,
            marks=tuple(self._marks),
            framework=self.framework,
            on_tpu=self.on_tpu,
            updated=time.time(),
        )
        self.report = report
        try:
            write_report(self.files, report)
        except Exception as error:  # noqa: BLE001 - a full disk or an absent store: the run goes on
            self.write_error = error
        return report


def _judged(rule: str, judge: Callable[[], Advice]) -> Advice:
    try:
        return judge()
    except Exception as error:  # noqa: BLE001 - one rule's failure is said in its place
        return not_checked(rule, f"{type(error).__name__}: {error}")
