"""Running on a cluster scheduler: what the Slurm and SkyPilot backends of `ddiloco run --backend`
(`backends.slurm`, `backends.skypilot`) write, submit and watch.

sbatch            the job scripts: one per synchronizer shard, one requeueable job per learner
slurm             submit, watch, requeue and cancel those jobs through Slurm's own commands
skypilot_tasks    the SkyPilot task YAMLs: an on-demand synchronizer task, a managed (spot) job per learner
skypilot_scripts  their `run:` scripts, and the run's own TLS certificate authority
skypilot_yaml     a small YAML writer (no YAML library needed to write the tasks)
skypilot          launch, watch and end them through the `sky` command
dataparallel_jobs the data-parallel baselines' jobs: one requeueable job per worker, and their table
"""
