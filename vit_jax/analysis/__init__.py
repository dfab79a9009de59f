"""The analysis wing: what a trained model shows (Section 4.5) and predicts.

attention.py computes the paper's numbers (attention distance, rollout,
embedding filters, position similarity), plots.py draws them,
classify.py turns logits into named top classes and features.py gives
the pooled features that the head reads.
"""
