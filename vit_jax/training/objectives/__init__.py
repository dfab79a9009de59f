"""Training objectives (base.py says what one is): config.objective names
one of REGISTRY; runs/settings.py's choices list the same names
(tests/test_objectives.py)."""

from vit_jax.training.objectives import (
  classification,
  dino,
  image_text,
  linear_probe,
  mae,
)

REGISTRY = {"classification": classification.Classification,
            "mae": mae.MaskedAutoencoding,
            "dino": dino.SelfDistillation,
            "image_text": image_text.ImageText,
            "linear_probe": linear_probe.LinearProbe}


def of(keys):
  """The objective class that a run's Settings `keys` name."""
  return REGISTRY[keys.objective]
