"""Telling a check that ran out of memory from one that loops: an allocation that
failed (Python's or torch's), and whether memory looks short right now, on the machine,
in its container (cgroup) or for the check's own process, when its time runs out.
"""

from __future__ import annotations


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says that an allocation failed (Python's or torch's)."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError)
        and ("can't allocate memory" in text or "out of memory" in text)
    )


def _numbers(path: str, unit: int = 1) -> dict[str, int]:
    """The `key: value [kB]` lines of a /proc file, in bytes ({} if unreadable)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":" if ":" in line else " ")
                value = rest.split()
                if value and value[0].isdigit():
                    out[key.strip()] = int(value[0]) * unit
    except OSError:
        pass
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def memory_shortage(pid: int | None = None) -> str:
    """Why memory looks short right now ("" when it does not): little left available
    to the machine or its container (cgroup), the process's pages swapped out, or tasks
    stalled waiting for memory (pressure stall information)."""
    notes = []
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit and usage and limit < 1 << 60 and usage > 0.9 * limit:
            notes.append(f"the container used {usage >> 20} of its {limit >> 20} MiB")
            break
    info = _numbers("/proc/meminfo", 1024)
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    if total and available is not None and available < 0.05 * total:
        notes.append(f"{available >> 20} of {total >> 20} MiB were available")
    if pid is not None:
        swapped = _numbers(f"/proc/{pid}/status", 1024).get("VmSwap", 0)
        if swapped > 64 << 20:
            notes.append(f"{swapped >> 20} MiB of the check's memory were swapped out")
    try:
        with open("/proc/pressure/memory") as f:
            full = next(line for line in f if line.startswith("full"))
        stalled = float(full.split()[1].split("=")[1])
        if stalled >= 10:
            notes.append(f"tasks stalled on memory {stalled:g}% of the last 10 s")
    except (OSError, StopIteration, IndexError, ValueError):
        pass
    return "; ".join(notes)


def timed_out(timeout: float, pid: int | None) -> str:
    """The message of a check that ran out of time, blaming memory when it was short."""
    short = memory_shortage(pid)
    if short:
        return (
            f"timed out after {timeout:g} s while memory was short ({short}): it "
            "stalled for lack of memory, not necessarily in an endless loop"
        )
    return f"timed out after {timeout:g} s (an endless loop, or one very long call?)"
