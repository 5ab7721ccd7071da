"""This process's threads, read from /proc (Linux), for the tests that count them or wait for a
group's threads to end.

A listing of /proc/self/task can miss live threads: the kernel walks the thread list on from
the entry it listed last, and stops there if that thread ends meanwhile, leaving out every thread
after it. A group's threads end while the test looks (Gloo's, its own), so a listing is taken
only when the process's count of threads is the same before and after it and matches it."""

import os


def count():
    """How many threads this process has (the kernel's own count: never an early stop)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/status says no Threads:")


def listing():
    """The ids of all of this process's threads, none missed (see the module's doc)."""
    while True:
        before = count()
        tasks = os.listdir("/proc/self/task")
        if len(tasks) == before == count():
            return tasks


def named():
    """{thread id: its name} of this process's threads; a thread that ends meanwhile is left out."""
    names = {}
    for task in listing():
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names[task] = comm.read().strip()
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
            continue
    return names
