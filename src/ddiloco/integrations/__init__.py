"""Decoupled DiLoCo inside the training loops people do not write themselves: each module joins one
framework's loop to a run through `LearnerClient.attach` (an optimizer step post-hook). Each needs its
framework installed (an optional extra); importing this package needs none of them (docs/api.md).

common        what every integration shares: the token counter, unwrapping, refusing DeepSpeed ZeRO
transformers  `DecoupledDiLoCoCallback` for the Hugging Face `Trainer` (extra `[hf]`)
accelerate    `join` for an `Accelerator` loop without the Trainer (extra `[hf]`)
lightning     `DecoupledDiLoCo`, a Lightning `Callback` (extra `[lightning]`)
torchtitan    `DecoupledDiLoCoTrainer` and config functions for torchtitan (extra `[torchtitan]`)
fragments     a model's fragments from its module names (layer-wise, as torchft's), for
              `Synchronizer(fragments=layer_fragments(model, P))`; plain torch
"""
