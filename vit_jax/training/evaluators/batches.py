"""What the evaluators share: a split's global batches and jitted functions
of (params, batch) over the run's shardings."""

import jax
import numpy as np

from vit_jax import errors, sharding
from vit_jax.data import broken_records, captions as captions_lib, pipeline
from vit_jax.models import naflex


class Batches:
  """Every evaluation batch of `split` as global arrays, padded and masked
  (pipeline.eval_dataset), read by each process for its devices; the log
  names the first broken images (broken_records.named). The input pipeline
  is built at the first evaluation and read again at the next: building it
  traces its functions (docs/input_pipeline.md, "Traced as written")."""

  def __init__(self, program, run, dataset, split, extras=None):
    self._program, self._run = program, run
    self._dataset, self._split, self._extras = dataset, split, extras
    self._rows = None

  def __iter__(self):
    keys, source = self._run.settings, self._run.sources(self._dataset)
    sharded = self._program.batch_sharding
    if self._rows is None:
      # One share per data-parallel device: an evaluation counts every
      # example once on any mesh, so its batches need not outlive one.
      shares, num_shares = sharding.process_blocks(sharded.mesh)
      self._rows = pipeline.eval_dataset(
          source, self._split, batch_size=keys.batch_size,
          image_size=keys.image_size, shares=shares, num_shares=num_shares,
          eval_crop_fraction=keys.eval_crop_fraction, extras=self._extras,
          naflex=self._run.naflex)
    for batch in broken_records.named(self._rows.as_numpy_iterator(),
                                      f"{source.name} {self._split}",
                                      keys.broken_images, keep_index=True):
      yield sharding.to_global(batch, sharded)


def scored(name, total, examples):
  """NAME_examples: the examples of a split of `total` that an evaluation
  scored, and NAME_skipped_examples, those it could not (broken images), if
  any."""
  return {f"{name}_examples": examples,
          **({f"{name}_skipped_examples": total - examples}
             if examples < total else {})}


def jit(program, fn, with_frozen=False):
  """fn(params, batch) compiled for the run's shardings, or, `with_frozen`,
  fn(params, batch, the objective's frozen params) (a distilling run's
  teacher's); every
  process gets the whole (replicated) result, so keep it small: sums, or a
  batch of features."""
  mesh = program.batch_sharding.mesh
  return jax.jit(sharding.constrained(fn, mesh),
                 in_shardings=(program.state_shardings.params,
                               program.batch_sharding)
                 + ((program.frozen.shardings,) if with_frozen else ()),
                 out_shardings=sharding.replicated(mesh))


def jit_texts(program, objective):
  """A two-tower objective's text_features(params, token ids) compiled for
  the run's params' shardings, the ids and the embeddings replicated (the
  zero-shot and retrieval evaluators')."""
  mesh = program.batch_sharding.mesh
  return jax.jit(sharding.constrained(objective.text_features, mesh),
                 in_shardings=(program.state_shardings.params,
                               sharding.replicated(mesh)),
                 out_shardings=sharding.replicated(mesh))


def class_captions(name, settings, run, datasets):
  """(templates, class names) of a two-tower evaluator `name` (zero_shot,
  retrieval): its settings', else config.image_text's; checked against the
  classes of each of `datasets` (a ConfigError naming the evaluator)
  before the run trains."""
  keys = run.settings.image_text
  templates = tuple(settings.templates) or tuple(keys.templates)
  class_names = tuple(settings.class_names) or tuple(keys.class_names)
  for dataset in datasets:
    try:
      captions_lib.check(templates, class_names,
                         run.sources(dataset).num_classes,
                         f"config.evaluators.{name}")
    except errors.InputError as e:
      raise errors.ConfigError(str(e)) from None
  return templates, class_names


def sum_over(step, params, batches):
  """Sums the integer counts `step` returns over all batches."""
  totals = {}
  for batch in batches:
    for key, value in step(params, batch).items():
      totals[key] = totals.get(key, 0) + int(value)
  return totals


def check_split(data, dataset, split):
  """An InputError now, not at the first evaluation, when the data is not
  there (`data`: the run's Sources; dataset "": the run's)."""
  data(dataset).num_examples(split)


class FeatureEvaluator:
  """What the evaluators of frozen features (few-shot, k-NN) share: the
  objective's features of a split's examples (`collect`), each split's
  batches built once, and the check of their datasets' splits."""

  kind = ""  # its config name, for messages

  def __init__(self, name, settings, run, program):
    self.name, self.settings, self.run = name, settings, run
    self.program = program

    def features(params, batch):
      return {"features": run.parts.objective.features(
                  params, naflex.inputs_of(batch)),
              "label": batch["label"], "mask": batch["mask"],
              "index": batch["index"]}

    self.features = jit(program, features)
    self._batches = {}  # (dataset, split): Batches

  @classmethod
  def check_datasets(cls, settings, data):
    """InputErrors unless `settings.datasets` maps each dataset to (train
    split, test split), each one the data has."""
    if not settings.datasets:
      raise errors.InputError(f"a {cls.kind} evaluator needs datasets: "
                              "{TFDS name: (train split, test split)}")
    for dataset, splits in settings.datasets.items():
      if len(splits) != 2:
        raise errors.InputError(
            f"datasets.{dataset} must be (train split, test "
            f"split), got {splits!r}")
      for split in splits:
        check_split(data, dataset, split)

  def split_batches(self, dataset, split):
    if (dataset, split) not in self._batches:
      self._batches[dataset, split] = Batches(self.program, self.run,
                                              dataset, split)
    return self._batches[dataset, split]

  def collect(self, params, dataset, split, most=None, with_index=False):
    """(features, labels) of the examples of `split`, in the order the
    evaluation batches bring them; the first `most` where given; and,
    `with_index`, each one's place in the split."""
    features, labels, places, count = [], [], [], 0
    for batch in self.split_batches(dataset, split):
      out = self.features(params, batch)
      keep = np.asarray(out["mask"]) > 0
      features.append(np.asarray(out["features"])[keep])
      labels.append(np.asarray(out["label"])[keep])
      places.append(np.asarray(out["index"])[keep])
      count += int(keep.sum())
      # Every process sees the same replicated mask, so all stop at the
      # same batch and their collectives stay in step.
      if most is not None and count >= most:
        break
    found = (np.concatenate(features)[:most], np.concatenate(labels)[:most])
    if with_index:
      return (*found, np.concatenate(places)[:most])
    return found
