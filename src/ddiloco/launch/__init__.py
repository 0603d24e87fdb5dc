"""Supervising processes: `ddiloco run` starts a synchronizer and M learners on one machine.

config      everything a run needs, resolved once
procs       child processes, each ended by its own PID
supervisor  starts, restarts and stops the children; injects chaos from `ddiloco.chaos`
live        the live terminal view
evaluate    eval loss of the global model (from a live shard or the checkpoints)
summary     the run's goodput, stalls and token accounting from the event logs and journals
"""
