"""Captions made of a labelled dataset's class names and templates: what an
image-text run reads where its images carry labels rather than captions
(the digits' demonstration, configs/siglip/digits.py), and what the
zero-shot classifier embeds (training/evaluators/zero_shot.py).

A class's names are one string, synonyms split by "|" ("seven|7"); a
template holds "{}" where the name goes ("a handwritten {}"). A class's
captions are every template with every one of its names.
"""

import numpy as np

from vit_jax import errors

SYNONYMS = "|"


def check(templates, class_names, num_classes, key):
  """An InputError naming `key` (a config key) unless there is a template,
  each with one "{}", and one entry of names for each of the
  `num_classes` classes."""
  if not templates:
    raise errors.InputError(f"{key}.templates is empty: give at least one, "
                            "'{}' where the class name goes")
  for template in templates:
    if template.count("{}") != 1:
      raise errors.InputError(
          f"{key}.templates: {template!r} must hold '{{}}' once, where the "
          "class name goes")
  if len(class_names) != num_classes:
    raise errors.InputError(
        f"{key}.class_names has {len(class_names)} entries for "
        f"{num_classes} classes: give each class's names, '|' between "
        "synonyms")


def of_classes(templates, class_names):
  """[classes][captions]: each class's captions, template by template,
  name by name."""
  return [[template.format(name.strip())
           for template in templates for name in names.split(SYNONYMS)]
          for names in class_names]


def table(tokenizer, captions):
  """(token ids int32 [classes, most captions, length], how many of each
  class's rows are captions int32 [classes]) of `of_classes`' captions;
  a class's rows past its count repeat its last caption."""
  counts = np.array([len(texts) for texts in captions], np.int32)
  ids = np.zeros((len(captions), counts.max(), tokenizer.length), np.int32)
  for row, texts in enumerate(captions):
    encoded = tokenizer.encode(texts)
    ids[row] = encoded[np.minimum(np.arange(counts.max()), len(texts) - 1)]
  return ids, counts
