"""The Vision Transformer in JAX/Flax, sharded over TPU pods."""
