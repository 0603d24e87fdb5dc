"""The networked runtime: the pure core driven by real time, real processes and gRPC.

Entry points: `client.LearnerClient` (any PyTorch training loop), `server.build_service` /
`server.SynchronizerServer` (a synchronizer shard), and the `ddiloco synchronizer`, `ddiloco learner`
and `ddiloco run` commands. See docs/runtime.md.
"""
