"""Decoupled DiLoCo: independent learners, a fragment-wise synchronizer, no global barrier."""

__version__ = "0.1.0"
