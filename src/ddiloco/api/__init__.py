"""The public API for your own model and data: a synchronizer started from a model object, the
model's embeddings found for you, data that resumes by itself, the global model exported, a run
stopped from anywhere. `ddiloco.<name>` re-exports what users import (docs/api.md).

Modules: model (parameters, embeddings, fragment count), synchronizer (`Synchronizer`), data
(`ResumableSampler`, `ResumableIterable`), export (`export_global`, `load_global`), control (`stop_run`).
"""
