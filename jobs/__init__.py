"""What runs on the accelerator: the job registry.

Each job module defines ``SPECS``, a tuple of ``JobSpec``. Importing this
package (or listing jobs) imports neither tensorflow nor textual; a job module
imports tensorflow inside its ``run`` function.
"""

from __future__ import annotations

import importlib

from jobs.base import JobSpec

# Order is the order users see in `tpudash jobs` and on the Jobs screen.
JOB_MODULES = (
    "jobs.matmul",
    "jobs.replicas",
    "jobs.all_reduce",
    "jobs.gradient_descent",
    "jobs.train",
    "jobs.dtensor_mlp",
)

_registry: dict[str, JobSpec] | None = None


def registry() -> dict[str, JobSpec]:
    """Every registered job by CLI name, in display order."""
    global _registry
    if _registry is None:
        specs: dict[str, JobSpec] = {}
        for module_name in JOB_MODULES:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as error:
                # Only a job module that is not installed at all is skipped (a
                # trimmed-down install); any import error inside one is raised.
                if error.name != module_name:
                    raise
                continue
            for spec in module.SPECS:
                specs[spec.name] = spec
        _registry = specs
    return _registry


class UnknownJobError(KeyError):
    """A job name that is not registered."""

    def __str__(self) -> str:
        return self.args[0]


def get_job(name: str) -> JobSpec:
    """The spec for ``name``; UnknownJobError lists what exists."""
    jobs = registry()
    if name not in jobs:
        raise UnknownJobError(f"unknown job {name!r}; allowed: {', '.join(jobs)}")
    return jobs[name]
