"""TFDS builders shipped with vit_jax; importing this package registers them.

`folder` is not registered by name: a folder of images is opened as
`dataset = "folder:PATH"` (see vit_jax/datasets/folder.py).
"""

from vit_jax.datasets import digits  # Registers "digits" with TFDS.
from vit_jax.datasets import folder  # pylint: disable=unused-import
