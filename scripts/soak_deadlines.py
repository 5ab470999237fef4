"""soak.py's deadline check (issue 38 item 13): each call's time counted from when it was made, as docs/security.md
promises it: from when keychaind read its first request, not from the client's start."""
import statistics


def made_at(records, path):
    """Sets each call's "made": when keychaind read its first request (docs/security.md: a call's deadline counts from
    then), from the request times keychaind wrote (its peer's pid, CLOCK_MONOTONIC: this script's clock); where it
    read none (killed before it sent, a credential fetch: the client sends at its start), the call's start."""
    reads = {}
    try:
        with open(path) as f:
            for line in f:
                pid, t = line.split()
                reads.setdefault(int(pid), []).append(float(t))
    except FileNotFoundError:
        raise SystemExit(f"keychaind wrote no request times ({path}): a release build? The soak needs a debug build")
    for r in records:
        if r["kind"] == "call":
            end = r["start"] + r["duration"]
            read = [t for t in reads.get(r.get("pid"), ()) if r["start"] - 0.01 <= t <= end]
            r["made"], r["requests"] = min(read, default=r["start"]), len(read)


def check_deadlines(calls, start, deadline, requests, grace, failures):
    """Appends a failure for each call that ended past its requests' deadlines + grace from when it was made; the
    summary to print (the longest calls, the clients' start before they sent, which is not keychaind's to promise)."""
    # Its requests' deadlines: those keychaind read, at most as many as the command makes (a prompting read whose
    # second request failed before its prompt is two, whatever the soak calls it).
    allowed = lambda r: next((n for op, n in requests.items() if r["op"].startswith(op)), 1)
    limit_of = lambda r: deadline * max(1, min(r.get("requests", 1), allowed(r))) + grace
    taken = lambda r: r["start"] + r["duration"] - r["made"]
    slow = [r for r in calls if taken(r) > limit_of(r)]
    for r in slow[:10]:
        failures.append(f"{r['op']} (uid {r['uid']}) made at {r['made'] - start:.1f} s (started {r['made'] - r['start']:.1f} s "
                        f"before) took {taken(r):.1f} s, over {limit_of(r):.0f} s: {r['outcome']}")
    single = [taken(r) for r in calls if allowed(r) == 1]
    text = (f"Longest call from when it was made: {max(map(taken, calls), default=0):.1f} s; over the {deadline:.0f} s "
            f"deadline: {sum(1 for r in calls if taken(r) > deadline)}; over their requests' deadlines + {grace:g} s grace: "
            f"{len(slow)}; longest one-request call {max(single, default=0):.1f} s.")
    starts = sorted(r["made"] - r["start"] for r in calls if r["made"] != r["start"])
    if starts:
        text += (f"\nClient start (its spawn to keychaind's read of its first request), {len(starts)} calls: median "
                 f"{statistics.median(starts):.2f} s, p99 {starts[int(len(starts) * 0.99)]:.2f} s, max {starts[-1]:.2f} s; "
                 f"longest call from its spawn {max((r['duration'] for r in calls), default=0):.1f} s.")
    return text
