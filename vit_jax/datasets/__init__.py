"""TFDS builders shipped with vit_jax; importing this package registers them."""

from vit_jax.datasets import digits  # Registers "digits" with TFDS.
