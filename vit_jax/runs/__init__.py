"""The runs wing: what a workdir holds.

workdir.py is the workdir (local or gs://): its layout and every file in
it, the only module that joins its path with a file name; store.py judges a
restart's config against the recorded one; checkpoints.py the orbax train
state; writers.py metrics.jsonl and TensorBoard; lock.py the one writer;
failures.py what a failing disk or bucket turns into.
"""
