"""Supervising processes: a synchronizer and M learners on one machine (`ddiloco run --backend local`,
driven by `backends.local`), and what every backend shares: the run's config and its records.

config          everything a run needs, resolved once, and its processes' command lines
procs           child processes, each ended by its own PID
supervisor      starts, restarts and stops the children; injects chaos from `ddiloco.chaos`
live            the live terminal view
livestate       the live state of a run, for the terminal view and the dashboard
dashboard       the live web dashboard (its page: dashboard_page; who may read it: dashauth)
shardstate      one hand-started shard's live state, for its dashboard (`ddiloco synchronizer --dashboard`)
metrics         metrics.jsonl over a run: eval loss of the global model, training loss, goodput so far
evaluate        eval loss of the global model (from a live shard or the checkpoints)
summary         the run's goodput, stalls and token accounting from the event logs and journals
"""
