"""The weights wing: params from and to files, and fitted to a new model.

npz.py reads the release's and big_vision's .npz layouts and writes the
release's; adaptation.py fits a checkpoint to a model of another resolution
or head; pytorch/ reads and writes PyTorch's HF transformers and timm
files; pretrained.py takes any source (a file or a workdir of ours);
exports.py writes every layout.
"""

from vit_jax.weights.adaptation import adapt
from vit_jax.weights.npz import load_npz, save_npz

__all__ = ["adapt", "load_npz", "save_npz"]
