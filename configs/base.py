"""Every config key at its default: a config file starts from
`get_config()` and sets what its experiment needs, and `vit_jax.main` takes
any key as --config.KEY=VALUE.

The keys, their defaults, bounds and meanings are in one place,
vit_jax/runs/settings.py; docs/config.md's "Config keys" table explains them.
"""

from vit_jax.runs import settings


def get_config():
  return settings.defaults()
