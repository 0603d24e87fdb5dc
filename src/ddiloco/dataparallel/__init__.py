"""Data-parallel baselines in real processes: what users run today, under the same faults as ours.

M worker processes form one torch.distributed job (DDP over gloo on the CPU, NCCL on CUDA) that
all-reduces gradients every step, with the model, data shards, inner optimizer and learning-rate
schedule of a ddiloco learner (docs/dataparallel.md).

config      everything one data-parallel run needs, and the worker's command line
rendezvous  generations of the job: the launcher names the members, workers form a process group
replicated  the state every rank holds alike (counters, data positions, optimizer moments)
checkpoint  model + optimizer in safetensors, counters in JSON, written atomically
worker      one worker process: join a generation, train, regroup after a failure
launcher    starts, kills (chaos), restarts the workers; `ddp` restarts the job, `elastic-ddp` regroups
slurm       the launcher with each worker a Slurm job (`--backend slurm`; the jobs: `cluster.dataparallel_jobs`)
summary     the run's summary in the fields `ddiloco run` writes, from journals and the last checkpoint
evaluation  eval loss of the newest checkpoint during the run, and of the final one
run         one run from start to summary (what `ddiloco run --method ddp|elastic-ddp` calls)
__main__    `python -m ddiloco.dataparallel run|worker`
"""
