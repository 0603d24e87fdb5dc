"""The backends of `ddiloco run`, behind one door: each takes a run's config and launches the run
where it asked (this machine, Slurm, SkyPilot), follows it to its end and stops it. The command line
parses its flags into the config and hands it over (`cli/run.py`); the backends print nothing
themselves: they report through an `Output` and return what the run left.

base          the door: `Backend` (launch, follow, stop), `Launched`, `Report`, `Output`, `Refused`
local         the supervised processes on this machine (`launch`), on loopback or a network of hosts
slurm         one Slurm job per synchronizer shard and per learner (`cluster.sbatch`, `cluster.slurm`)
slurm_record  what a followed Slurm run records in its run directory, as a local run does
skypilot      an on-demand synchronizer task and a managed (spot) job per learner (`cluster.skypilot*`)
dataparallel  the data-parallel baselines, ddp and elastic-ddp, locally or as Slurm jobs (`dataparallel`)
"""
