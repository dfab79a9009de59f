"""Polyak averaging: an exponential moving average of the params.

With `config.polyak_decay` d > 0 the train state keeps
  average <- d * average + (1 - d) * params
after every update, starting from the initial params. It is sharded like
the params, saved in every checkpoint, and it is what evaluation and export
use. Table 2 fine-tunes ImageNet with d = 0.9999 (docs/paper.md, Sec. 4.1).
"""

import jax


def init(params, decay):
  """The average's initial value, or None when averaging is off."""
  return params if decay else None


def update(average, params, decay):
  if average is None:
    return None
  return jax.tree.map(lambda a, p: decay * a + (1 - decay) * p, average,
                      params)


def eval_params(state):
  """The params a state is evaluated and exported with."""
  return state.params if state.polyak is None else state.polyak
