"""The runs wing: what a workdir holds.

store.py is its recorded config (config.json, the only module that reads or
writes it) and the guard against a changed one; checkpoints.py the orbax
train state; writers.py metrics.jsonl and TensorBoard; storage.py what a
failing disk or bucket turns into.
"""
