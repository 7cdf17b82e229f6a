"""How much memory this process can still take on the host, for the jobs' pre-flight checks.

A job that would not fit is refused before it allocates anything, with a
message naming the sizes (the CLI exits 2 and no run directory is made).
MemAvailable is what the kernel could hand out; a container's cgroup limit
caps it, counting the page cache the kernel can drop as free.
"""

from __future__ import annotations

import os

GIB = 2**30
# cgroup v1 reports "no limit" as a huge page-rounded number.
UNLIMITED_CGROUP_BYTES = 2**60


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _inactive_file_bytes(stat_path: str, key: str) -> int:
    """Page cache the kernel can drop, which a cgroup's usage counts."""
    try:
        with open(stat_path, encoding="ascii") as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except (OSError, UnicodeDecodeError):
        pass
    return 0


def _cgroup_headroom() -> int | None:
    """Bytes left under this container's memory limit, None without a limit."""
    for limit_path, usage_path, stat_path, inactive_key in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat", "inactive_file"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            "/sys/fs/cgroup/memory/memory.stat",
            "total_inactive_file",
        ),
    ):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is None or usage is None or limit >= UNLIMITED_CGROUP_BYTES:
            continue
        return max(0, limit - max(0, usage - _inactive_file_bytes(stat_path, inactive_key)))
    return None


def available_host_bytes() -> int | None:
    """Memory this process can still take: MemAvailable, capped by a cgroup limit."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            available = None
    headroom = _cgroup_headroom()
    if headroom is not None:
        available = headroom if available is None else min(available, headroom)
    return available


def format_gib(size: float) -> str:
    return f"{size / GIB:.1f} GiB"
