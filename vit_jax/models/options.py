"""How a setting is declared: once, as a dataclass field with its default,
a line on what it means, its bounds or choices, whether a restart may change
it and what runs recorded before it existed did; a model option also with
what it is (its `kind`) and, where a checkpoint fixes it, the parameter
that reveals it (`marks`).

ViTConfig's fields (models/config.py) are declared with `key`; the config's
model section (runs/settings.py) is derived from them, and the rest of the
config is declared with the same `key`. The declaration lives here, on the
models' floor, because the models are the lowest wing that has settings.
"""

import copy
import dataclasses
import numbers

import numpy as np

# `before` of a key that runs recorded from the first: none.
ORIGINAL = object()
# `before` of a key whose value a restart resolves (training/resolve.py).
RESOLVED = object()
# `before` of a key that did what its default does.
AS_DEFAULT = object()
# `config` of a model option whose config key has the model's default.
SAME = object()

# `kind` of a model option that changes the function a model's params
# compute but not their shapes (a source's function travels with its
# weights: pretrained.with_source) ...
FUNCTION = "function"
# ... and of one that changes which params there are: a checkpoint fixes
# it, and a fine-tune reads it from the params (`marks`).
ARCHITECTURE = "architecture"


@dataclasses.dataclass(frozen=True)
class Marks:
  """How params in the release layout (a flat '/'-keyed dict of arrays or
  shapes) reveal an option: the value of the first of `params` they hold,
  else `absent`. A value that is callable is called with that param's
  shape."""
  params: dict
  absent: object

  def read(self, flat):
    for name, value in self.params.items():
      if name in flat:
        return value(np.shape(flat[name])) if callable(value) else value
    return self.absent


def key(default=dataclasses.MISSING, description="", *, at_least=None,
        below=None, at_most=None, choices=None, changeable=False,
        before=ORIGINAL, config=SAME, kind=None, marks=None):
  """A field: `default` (none: the field is required), a one-line
  `description`; for a number, its bounds: `at_least`, and `below` or
  `at_most` (None: none; an int `at_least` alone asks for a whole number);
  or the values it may take (`choices`); whether a restart may change it
  (`changeable`); `before`, what a run recorded without it did (ORIGINAL:
  every run recorded it; AS_DEFAULT: its default; RESOLVED: whatever the
  restart resolves it to; else that value). For a model option: `config`,
  its default as a config key where it differs from the model's: None
  (unset: the model's name or init_from says) or "auto" (the run resolves
  it from the devices); `kind`, FUNCTION or ARCHITECTURE where a source of
  weights fixes it; `marks`, how the params reveal it (Marks)."""
  metadata = {"description": description, "at_least": at_least,
              "below": below, "at_most": at_most, "choices": choices,
              "changeable": changeable, "before": before, "config": config,
              "kind": kind, "marks": marks}
  if isinstance(default, dict):
    return dataclasses.field(default_factory=lambda: copy.deepcopy(default),
                             metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def problem(name, value, metadata, unset_allowed=True):
  """What is wrong with `value` for the field `name` declared with
  `metadata`, or None: one of its choices, within its bounds, unbounded, or
  unset (None) where `unset_allowed`."""
  if value is None and unset_allowed:
    return None
  choices = metadata.get("choices")
  if choices is not None:
    if value in choices:
      return None
    return f"{name} must be one of {list(choices)}, got {value!r}"
  low, high, top = (metadata.get("at_least"), metadata.get("below"),
                    metadata.get("at_most"))
  if low is None:
    return None
  if isinstance(low, int) and high is None and top is None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (
        value < low):
      return f"{name} must be a whole number >= {low}, got {value!r}"
    return None
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or (
      not low <= value or (high is not None and not value < high) or (
          top is not None and not value <= top)):
    bound = (f"in [{low}, {high})" if high is not None else
             f"in [{low}, {top}]" if top is not None else f">= {low}")
    return f"{name} must be a number {bound}, got {value!r}"
  return None


def sizes_of(sizes, keys, prefix):
  """The dataclass `sizes` (a part's sizes: MAE's decoder, a DINO head,
  the text tower) whose fields a config section `keys` names prefix +
  field (runs/objective_settings.py derives those keys from its
  declaration)."""
  return sizes(**{field.name: getattr(keys, prefix + field.name)
                  for field in dataclasses.fields(sizes)})


# What each of a transformer's sizes is, in the order transformer_sizes
# takes their defaults.
TRANSFORMER_SIZES = (("hidden_size", "width"), ("num_layers", "blocks"),
                     ("num_heads", "attention heads"),
                     ("mlp_dim", "MLP width"))


def transformer_sizes(name, part, defaults, prefix, doc, module, extra=()):
  """The frozen dataclass `name` of a transformer part's sizes (MAE's
  decoder, the text tower), declared once for every such part: its
  TRANSFORMER_SIZES at `defaults`, each described as `part`'s ("the
  decoder's width"), then `extra` fields ((name, type, key(...)), ...).
  `of(keys)` reads them from a config section's keys named prefix + field
  (`sizes_of`); `module`: the declaring module's __name__."""
  fields = [(field, int, key(default, f"{part} {what}", at_least=1,
                             before=AS_DEFAULT))
            for (field, what), default in zip(TRANSFORMER_SIZES, defaults)]
  return dataclasses.make_dataclass(
      name, [*fields, *extra], frozen=True, namespace={
          "__module__": module, "__doc__": doc,
          "of": classmethod(lambda cls, keys: sizes_of(cls, keys, prefix))})
