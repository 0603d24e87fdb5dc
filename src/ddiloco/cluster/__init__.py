"""Running on a cluster scheduler: the Slurm backend of `ddiloco run --backend slurm`.

sbatch      the job scripts: one per synchronizer shard, one requeueable job per learner
slurm       submit, watch, requeue and cancel those jobs through Slurm's own commands
"""
