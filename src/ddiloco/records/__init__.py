"""What a run writes down, shared by every part: the event log (one schema for the simulator and the
runtime), atomic file writes, logging set-up, and interval accounting (so "uptime" means one thing).

    events      the JSON-lines event log and its schema
    atomic      write-rename-fsync, so a crash leaves the old file or the new one
    logsetup    one line per record on stderr, tagged with the process's role
    intervals   the union of [start, end) intervals
    supervise   background threads that log a failure (its traceback once) and retry it with backoff
"""
