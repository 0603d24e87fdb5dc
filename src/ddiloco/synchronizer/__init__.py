"""The synchronizer service: drives the pure `SynchronizerCore` with real time, sessions and disks.

server      the gRPC server around a service; `build_service` from a model's parameters
handlers    gRPC methods: bytes in, service calls, bytes out; nothing a client sends raises out
service     the service: lifecycle and contributions, all under one lock
membership  registration, heartbeats and leaving; owns the sessions and token grants (`service.membership`)
sessions    one learner's session, and the table of them
dispatch    carrying out the core's actions (merge booked, update queued, pull requested)
timer       the timer thread: grace deadlines, silent learners, the run's budget
outbox      one learner's outbound queue: control first, newest update per fragment only
commit      group commit: an update leaves only once its version is durable
checkpoint  write-ahead safetensors + JSON manifest, and loading them
ledger      who trained which tokens, what was merged, where each learner's data resumes
grants      how far each learner may train, so that the run stops at its token budget
status      what the service says about itself (Status RPC, stuck rounds)
"""
