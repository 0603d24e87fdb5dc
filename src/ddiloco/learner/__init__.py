"""The learner side: drives the pure `LearnerCore` from any PyTorch training loop.

client      `LearnerClient`: a few lines in a training loop; communication in the background
attach      `client.attach(optimizer)`: a step post-hook, so a loop that calls `optimizer.step()` takes part
leader      rank 0's side of the client's step boundary: the links' events in, the core's messages out
link        one background connection per synchronizer shard: register, heartbeat, push, subscribe
outbound    a link's sending threads: the pusher and the heartbeater
joining     the shards' registration replies checked, the global parameters awaited
ending      when a learner stops on its own: a finished run, or cut off past the orphan bound (exit code 3)
fanout      in a torch.distributed learner, rank 0 talks; replicated or FSDP2-sharded ranks follow
journal     the learner's record of what it trained and sent, for the run's token accounting
state       the learner's own inner-optimizer state on disk, saved in the background
trainer     the built-in training loop behind `ddiloco learner`
fetch       the current global model, read-only, from the shards
"""
