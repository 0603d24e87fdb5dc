"""The virtual-clock cluster: real models, data and training on simulated time, hardware and
failures, driving the same pure core as the networked runtime; plus its data-parallel baselines."""
