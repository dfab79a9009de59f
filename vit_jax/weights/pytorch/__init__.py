"""The PyTorch interchange: the safetensors files of Hugging Face
transformers and timm, read into the release layout and written from it,
as numpy; PyTorch pickles are refused.

files.py holds what the families share (safetensors and config I/O, the
write checks), layouts.py the key names and array conversions; hf.py,
timm.py, eva.py and mae.py (masked autoencoders) read and write a family
each.
"""
