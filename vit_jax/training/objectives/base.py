"""What a training objective is: the seam between the shared step and
what a run learns.

The step (training/step.py) owns what every run does alike: the train
state, the micro-batches, the optimizer, the Polyak average, the
shardings, and the loop, the checkpoints, preemption, goodput and the
planner around it. An objective owns what differs, each in a module of its
own under training/objectives/, and says it through these methods:

  model                 the flax Module whose params the state trains
  init_params(rng, s)   fresh params, from images of side s
  prepare(batch, step)  inside the step, on the whole global batch, before
                        it is split into micro-batches: the model's inputs
                        and the loss's targets (labels smoothed and mixed;
                        masks drawn), each a row per example, and "mask"
                        (1 for an example that counts)
  teach(held, micro)    the micro-batch with what the objective makes of
                        it outside the gradient, from what step.Held
                        holds: the params, the served params, its carry,
                        its frozen inputs (a teacher's params, placed over
                        the mesh)
  loss(params, micro, weights, key)
                        (the loss, {name: a part of it}), each a sum over
                        the micro-batch's examples weighed by `weights`
                        (1 / the batch's count each), so that the step adds
                        micro-batches up to the batch's mean; `key` draws
                        the dropout
  flops_per_image(...)  a training step's FLOPs per image (MFU, the plan)
  held_out(params, batch)
                        each example's loss [N] on held-out data (the
                        "loss" evaluator), where it has one
  features(params, images)
                        [N, D]: what the few-shot evaluator fits a ridge
                        regression on and the k-NN evaluator votes with
  targets(batch_size)   {name: (shape, dtype)}: what the input pipeline
                        feeds it to learn from beside the images (a
                        batch's labels, by default; planning compiles
                        with them)
  tokenize()            what the input pipeline tokenises each image's
                        caption with (numpy bytes [rows] -> int32 [rows,
                        length]), where the objective reads the
                        dataset's captions; None (the default): labels
  evaluator_kinds       the evaluator kinds (training/evaluators) whose
                        numbers mean something for it
  check_run(keys, evaluations)
                        ConfigErrors of what the built model and the
                        evaluators allow (an evaluator of another kind)

and, before a run is built, as class methods on its Settings:

  check(keys)           ConfigErrors of its own keys, naming each
  paths(keys)           ((path, its key), ...) that it reads
  pinned(keys, recorded) keys with a hub name it reads made a commit
  load(keys)            its frozen inputs (a teacher), read once, or None:
                        something with on_mesh(mesh, fsdp_min_bytes) giving
                        (shapes, shardings, params()) over the run's mesh
  reads_labels(keys)    whether it learns from the dataset's labels (a
                        dataset of one class is refused where it does)
  reads_captions(keys)  whether it learns from the dataset's captions (a
                        dataset without is refused where it does)

State beside the params, where an objective keeps any (running
statistics, a centre), and what a run serves (is evaluated and exported
with; checkpoints name it "polyak"):

  init_carry(params)    its state beside the params (step.CarryingState),
                        or None (the default: a TrainState)
  observe(micro, weights)
                        {name: array}: weighted sums over a taught
                        micro-batch that the step adds up over the batch,
                        as it adds the loss
  update_carry(carry, observed, step, served)
                        the carry after the batch's update; `served`: what
                        the run served while it taught the batch
  init_served(params, carry, decay), update_served(served, params, carry,
                        decay, step)
                        what evaluation, export and the read-only tools
                        use, or None for the params themselves: by default
                        their Polyak average at config.polyak_decay (an
                        EMA teacher's momentum may follow the step)


config.objective names one (objectives.REGISTRY). A new one is a module
here, a line in REGISTRY and in runs/settings.py's choices, and its
section of config keys; docs/design.md tells the steps.
"""

import jax
import jax.numpy as jnp

from vit_jax import errors, models
from vit_jax.models import flops
from vit_jax.runs.workdir import Workdir
from vit_jax.training import polyak
from vit_jax.weights import pretrained


class Objective:
  """The defaults every objective shares; see the module docstring."""

  name = ""  # config.objective's value

  evaluator_kinds = ("accuracy", "real", "fewshot", "knn")  # check_run allows
  frozen = None  # what `load` read, where it reads anything

  def __init__(self, model, seed):
    self.model = model
    self.seed = seed

  @classmethod
  def check(cls, keys):
    del keys

  @classmethod
  def paths(cls, keys):
    del keys
    return ()

  @classmethod
  def pinned(cls, keys, recorded=None):
    del recorded
    return keys

  @classmethod
  def load(cls, keys):
    del keys
    return None

  @classmethod
  def reads_labels(cls, keys):
    """Whether it learns from the dataset's labels."""
    del keys
    return True

  @classmethod
  def reads_captions(cls, keys):
    """Whether it learns from the dataset's captions."""
    del keys
    return False

  def check_run(self, keys, evaluations):
    """ConfigErrors of what the built model and the evaluators allow: an
    evaluator of a kind whose numbers mean nothing for it."""
    del keys
    for evaluation in evaluations:
      if evaluation.kind not in self.evaluator_kinds:
        raise errors.ConfigError(
            f"config.evaluators.{evaluation.name}: a {evaluation.kind!r} "
            f"evaluator does not apply to config.objective="
            f"{self.name!r}, which takes {list(self.evaluator_kinds)}; "
            f"or set its `every` to 0")

  @staticmethod
  def refuse_set(name, what_it_does, keys_and_offs):
    """A ConfigError naming the first of (key, value, off) that is set
    (anything but off, unset or 0): it does not apply to objective
    `name`, which does `what_it_does`."""
    for key, value, off in keys_and_offs:
      if value:
        raise errors.ConfigError(
            f"{key}={value!r} does not apply to {name}, which "
            f"{what_it_does}: set it to {off!r}")

  def held_out(self, params, batch):
    """Each example's loss [N] on a held-out batch (evaluators/loss.py),
    where the objective has one apart from its labels."""
    raise NotImplementedError

  def init_params(self, rng, image_size):
    images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
    return self.model.init(rng, images, train=False)["params"]

  def stream(self, tag, step):
    """A key of its own for draws `tag` at `step`: a stream apart from the
    dropout's and every other objective's draws."""
    return jax.random.fold_in(
        jax.random.fold_in(jax.random.key(self.seed), tag), step)

  def features(self, params, images):
    """What the head reads (the pre-logits), for a classifier."""
    return models.logits_and_pre_logits(self.model, params, images)[1]

  def teach(self, held, micro):
    del held
    return micro

  def tokenize(self):
    return None

  def targets(self, batch_size):
    return {"label": ((batch_size,), jnp.int32)}

  def init_carry(self, params):
    del params
    return None

  def observe(self, micro, weights):
    del micro, weights
    return {}

  def update_carry(self, carry, observed, step, served):
    del observed, step, served
    return carry

  def init_served(self, params, carry, decay):
    del carry
    return polyak.init(params, decay)

  def update_served(self, served, params, carry, decay, step):
    del carry, step
    return polyak.update(served, params, decay)

  def flops_per_image(self, image_size, num_patches=None, slots=1):
    return flops.flops_per_image(self.model, image_size, train=True,
                                 num_patches=num_patches, slots=slots)


def run_of(source, objective, also):
  """(Settings, params) of `source`, a workdir (DIR or DIR:STEP) of a run
  of config.objective `objective`: what it serves at that step (the
  newest by default). An InputError says it is neither that nor `also`
  (the library's directory the caller reads besides)."""
  directory, step = pretrained.parse_source(source)
  if not Workdir(directory).has_run():
    raise errors.InputError(
        f"{source} is neither a workdir of a run of config.objective="
        f"{objective!r} nor {also} (config.json and model.safetensors)")
  keys = Workdir(directory).read_config()
  if keys.objective != objective:
    raise errors.InputError(
        f"{source} is a run of config.objective={keys.objective!r}: this "
        f"reads a run of {objective!r}")
  params, _ = pretrained.load_run(directory, step)
  return keys, params
