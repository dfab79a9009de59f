"""The analysis wing: what a trained model shows (Section 4.5) and predicts.

attention.py computes the paper's numbers (attention distance, rollout,
embedding filters, position similarity), plots.py draws them, and
classify.py turns logits into named top classes.
"""
