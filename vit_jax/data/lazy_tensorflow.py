"""TensorFlow, imported where it is first used rather than where it is named.

Only reading data needs TensorFlow (tf.data, image decoding, tf.io.gfile),
and importing it slows a tool's start (docs/speed_on_cpu.md, "A tool's
start"). The modules that use it write `from vit_jax.data.lazy_tensorflow
import tf` and `tf.x` as usual: a tool that reads no data (export, plan,
figures of a run's metrics) and a mistake found before the data is read
start without it.
"""

import importlib


class _Module:
  """Stands for a module, and imports it at the first attribute read."""

  def __init__(self, name):
    self._name = name

  def __getattr__(self, attribute):
    return getattr(importlib.import_module(self._name), attribute)

  def __repr__(self):
    return f"<{self._name}, imported at its first use>"


tf = _Module("tensorflow")
