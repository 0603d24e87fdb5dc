"""Failures on purpose: failure traces (`trace`) shared by the simulators and the launcher, and the
launcher's injector (`injector`: kill -9, SIGSTOP, synchronizer kills on a schedule or a trace)."""
