"""What the learner and the synchronizer both speak: nothing here knows either side.

framing     messages and tensors as raw bytes with a JSON header, chunked
reassembly  frames back into messages, each size-checked before anything is buffered
quant       the tensor codecs (fp32, bf16, int8, int4) with their validity checks
protocol    the model signature, the plan's JSON form, what a refusal's code asks the learner to do
headers     a contribution's head and the reply to it: one definition of their keys, both sides
fields      range checks for the numbers and texts a peer sends
rpc         gRPC plumbing: bytes-in/bytes-out methods, one control and one bulk channel
auth        the shared-token rule, and TLS
timeouts    the one set of timeouts, derived from the heartbeat interval
routing     which synchronizer shard owns which fragment
runend      the mark a finished shard leaves beside its address file, read by learners cut off across the end
"""
