"""The data wing: datasets, their records, and the batches a run reads.

sources.py looks datasets up (TFDS, the digits we ship, folders of images,
VTAB tasks); pipeline.py turns a split into each process's rows of every
global batch, streaming TFRecord or reading ArrayRecord at random
(random_access.py); conversion.py rewrites TFRecord as ArrayRecord;
preprocess.py decodes and augments; broken_records.py masks what does not
decode; shares.py decides which shares a process reads.
"""
