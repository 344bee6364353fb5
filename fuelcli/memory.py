"""Resident memory of this process, for stats lines and the memory budget tests."""

import resource


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def reset_peak_rss() -> None:
    """Start peak_rss_bytes() afresh (Linux: writing 5 to clear_refs resets the high-water mark)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
