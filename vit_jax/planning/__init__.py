"""The planning wing: what a config will cost on a TPU slice.

catalogue.py knows the TPU generations and slices; cost.py compiles the
config's own train step ahead of time for a slice and reads its memory and
cost; report.py words the result.
"""
