"""Resident memory of this process, for stats lines and the memory budget tests, and the memory still
available, for the size checks before allocating (Linux /proc, cgroup v2)."""

from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    """This process's high-water RSS (VmHWM). Not getrusage's ru_maxrss: after fork + exec that also
    carries the parent's peak, so a child of a big process would report its parent's memory."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # no VmHWM: best effort


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def reset_peak_rss() -> None:
    """Start peak_rss_bytes() afresh (Linux: writing 5 to clear_refs resets the high-water mark)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def available_bytes() -> int | None:
    """Memory this process can still take without swapping: /proc/meminfo's MemAvailable, lowered
    to the cgroup v2 limit's headroom when one is set; None when the system does not say."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            room = max(int(limit) - used, 0)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail
