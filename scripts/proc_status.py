"""A process's /proc/<pid>/status as a dictionary, shared by the scripts that sample keychaind (soak.py, bench-package.py)."""


def proc_status(pid):
    """The fields of /proc/<pid>/status, each value stripped ("VmRSS": "28400 kB", "Threads": "5")."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields
