"""``tpudash run JOB --profile-steps A-B``: the flag checked and given to the job as its ``profile_steps`` param.

The job (train) hands the window to the run's profile responder (``JobContext.profiler.schedule``),
so the capture lands in ``<run>/profile`` as a live request's does (``tpudash.cli.profiling``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpudash.cli.exits import BadInput

if TYPE_CHECKING:
    from jobs.base import JobSpec


def with_profile_steps(spec: JobSpec, assignments: dict[str, str], steps: str) -> dict[str, str]:
    """``assignments`` with the job's ``profile_steps`` param set from ``--profile-steps``; BadInput if it cannot be.

    A job without training steps (matmul, the checks) has nothing to profile by step: it is
    refused, naming the jobs that can. The same window given twice differently is refused too.
    """
    from jobs import registry
    from jobs.base import ParamError

    if not spec.profiles_steps:
        can = ", ".join(name for name, other in registry().items() if other.profiles_steps)
        raise BadInput(f"--profile-steps: job {spec.name} has no training steps to profile; allowed with: {can}")
    try:
        spec.param("profile_steps").parse(steps)
    except ParamError as error:
        raise BadInput(f"--profile-steps: {error.message}") from None
    set_before = assignments.get("profile_steps")
    if set_before is not None and set_before.strip() != steps.strip():
        raise BadInput(f"--profile-steps: {steps!r} and --set profile_steps={set_before} disagree; give one")
    return {**assignments, "profile_steps": steps}
