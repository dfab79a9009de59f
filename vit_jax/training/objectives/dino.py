"""Self-distillation as DINOv2 pre-trains (Oquab et al. 2024; DINO, Caron
et al. 2021; iBOT, Zhou et al. 2022): config.objective "dino", config.dino's
keys; the model is models/dino.py's. No labels are read.

Each training image becomes 2 global crops (config.image_size, 32-100% of
the image) and `local_crops` local ones (`local_size`, 5-32%), with
DINOv2's colours, blur and solarisation, drawn on the device
(training/crops.py), row r of step s's batch from (seed, CROP_STREAM, s,
r): a resumed run, or one on another mesh or with other processes, crops
what an uninterrupted one cropped. Half of the global crops (drawn per
crop) get a block mask of 10-50% of their patches (BEiT's masking).

The teacher is an exponential moving average of the student (what the run
serves: its checkpoints' "polyak", what evaluation, `features`, `export`
and `init_from` read), its momentum from `momentum` to 1 by a cosine over
the run. It sees the global crops; its class tokens through DINO's head,
and the masked patches' tokens through iBOT's, are centred and sharpened
(Sinkhorn-Knopp over the whole batch, or a running center kept beside the
params, config.dino.centering) at a temperature warmed up from 0.04 to
0.07. The student sees every crop, the global ones masked, the local ones
as their own batch at their own grid (no padding). The loss
(training/dino_losses.py's functions, DINOv2's weights):

  DINO:  the cross-entropy of each student crop's class-token
         distribution to each teacher crop's but its own (the 2 global
         crops crossed, each local to both), the pairs' mean;
  KoLeo: `koleo_weight` x, for each global crop, -mean log distance of a
         student class token (before the head) to its nearest other in the
         batch;
  iBOT:  each masked global crop's mean cross-entropy over its masked
         patches, the mean over crops.

DINOv3's Gram anchoring (`gram_weight` > 0): from step `gram_start` on,
a Gram teacher, a snapshot of the EMA teacher's backbone kept in the carry
(sharded as the params are), sees the global crops unmasked; the loss adds
`gram_weight` x each global crop's mean squared difference between the
cosine-similarity matrices of the student's patch tokens and the Gram
teacher's (dino_losses.gram_loss, per image), the crops' mean. The
snapshot is taken from the EMA teacher that taught the step before
`gram_start`, and again every `gram_update_every` steps, `gram_max_updates`
times (DINOv3 takes the teacher after that step's EMA update, one update
later). DINOv3's Gram teacher sees the crops at twice the resolution
without colour distortion; this one sees the teacher's crops.

Every sum over the batch (Sinkhorn-Knopp's, the center's, KoLeo's nearest
neighbours) runs over the global batch under jit, so the numbers do not
depend on how the batch is split over devices and hosts. Where DINOv2
departs from that (KoLeo within each GPU's batch; masks stratified over
each GPU's batch), this follows the global batch instead; docs/dino.md
says so. A batch is one micro-batch: Sinkhorn-Knopp needs the whole batch
at once (config.accum_steps must be 1).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors, models
from vit_jax.models import dino as dino_lib, flops
from vit_jax.training import crops as crops_lib, dino_losses
from vit_jax.training.objectives import base

CROP_STREAM = 0x63726f70  # "crop"
MASK_STREAM = 0x69626f74  # "ibot"
NUM_GLOBAL_CROPS = 2  # DINOv2's code asserts it
# BEiT's block masking (DINOv2's MaskingGenerator): each block at least
# MIN_BLOCK patches, of aspect in [BLOCK_ASPECT, 1 / BLOCK_ASPECT]; the
# drawing stops after BLOCK_TRIES blocks in a row add nothing.
MIN_BLOCK = 4
BLOCK_ASPECT = 0.3
BLOCK_TRIES = 10
CENTERINGS = ("center", "sinkhorn_knopp")


def model_of(keys):
  """The SelfDistillationModel of a run's Settings `keys`."""
  backbone = models.create_from_settings(keys.model, 1).config
  model = dino_lib.SelfDistillationModel(
      backbone, dino_lib.HeadSizes.of(keys.dino),
      keys.dino.ibot_separate_head)
  model.check_options()
  return model


def teacher_temperature(step, dino):
  """DINOv2's: linear from warmup_temperature to teacher_temperature over
  the first teacher_warmup_steps (numpy's linspace over them), then
  constant."""
  warmup = dino.teacher_warmup_steps
  share = jnp.clip(step / max(warmup - 1, 1), 0.0, 1.0) if warmup else 1.0
  return (dino.warmup_teacher_temperature + share * (
      dino.teacher_temperature - dino.warmup_teacher_temperature))


def teacher_momentum(step, start, total_steps):
  """DINOv2's cosine from `start` (step 0) towards 1 (at total_steps)."""
  progress = jnp.asarray(step, jnp.float32) / total_steps
  return 1 - (1 - start) * 0.5 * (1 + jnp.cos(jnp.pi * progress))


def block_mask(key, rows, cols, count, max_block):
  """[rows * cols] bool: BEiT's block masking of `count` patches (a
  traced int): blocks of a random area in [MIN_BLOCK, what remains (at
  most max_block)] and aspect, each at a random place, kept where it
  masks at least one new patch and no more than remain; until `count` are
  masked or BLOCK_TRIES blocks in a row add none."""
  log_aspect = jnp.log(jnp.array([BLOCK_ASPECT, 1 / BLOCK_ASPECT]))
  row_index, col_index = jnp.arange(rows), jnp.arange(cols)

  def body(carry):
    mask, masked, misses, key = carry
    key, area_key, aspect_key, top_key, left_key = jax.random.split(key, 5)
    remain = jnp.minimum(count - masked, max_block)
    area = jax.random.uniform(area_key, minval=MIN_BLOCK,
                              maxval=jnp.maximum(remain, MIN_BLOCK))
    aspect = jnp.exp(jax.random.uniform(aspect_key, minval=log_aspect[0],
                                        maxval=log_aspect[1]))
    height = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
    width = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
    fits = (height < rows) & (width < cols)
    top = jax.random.randint(top_key, (), 0, jnp.maximum(rows - height, 1))
    left = jax.random.randint(left_key, (), 0, jnp.maximum(cols - width, 1))
    block = (((row_index >= top) & (row_index < top + height))[:, None]
             & ((col_index >= left) & (col_index < left + width))[None, :])
    added = (block & ~mask).sum()
    take = fits & (added > 0) & (added <= remain)
    mask = jnp.where(take, mask | block, mask)
    return (mask, masked + jnp.where(take, added, 0),
            jnp.where(take, 0, misses + 1), key)

  def running(carry):
    _, masked, misses, _ = carry
    return (masked < count) & (misses < BLOCK_TRIES)

  mask, _, _, _ = jax.lax.while_loop(
      running, body, (jnp.zeros((rows, cols), bool), jnp.int32(0),
                      jnp.int32(0), key))
  return mask.reshape(-1)


def first_masked(masks, count):
  """(indices [..., count] of each row's first `count` masked patches, in
  their order; valid [..., count]: where a row has that many)."""
  order = jnp.argsort(jnp.where(masks, 0, 1), axis=-1, stable=True)[
      ..., :count]
  return order, jnp.take_along_axis(masks, order, axis=-1)


class SelfDistillation(base.Objective):
  """DINOv2's self-distillation: the module docstring."""

  name = "dino"
  evaluator_kinds = ("knn", "fewshot")

  def __init__(self, keys, num_classes, frozen=None):
    del num_classes, frozen
    super().__init__(model_of(keys), keys.seed)
    self.dino = keys.dino
    self.total_steps = keys.total_steps
    self.spec = crops_lib.CropSpec(
        num_global=NUM_GLOBAL_CROPS, global_size=keys.image_size,
        global_scale=tuple(keys.dino.global_scale),
        num_local=keys.dino.local_crops, local_size=keys.dino.local_size,
        local_scale=tuple(keys.dino.local_scale),
        blur_sigma=tuple(keys.dino.blur_sigma),
        flip_prob=keys.dino.flip_probability,
        jitter_prob=keys.dino.jitter_probability,
        grey_prob=keys.dino.grey_probability,
        global_blur_prob=tuple(keys.dino.global_blur_probability),
        local_blur_prob=keys.dino.local_blur_probability,
        global_solarize_prob=tuple(keys.dino.global_solarize_probability))
    patches = (keys.image_size // self.model.config.patch_size) ** 2
    # The most patches a crop's mask holds: where iBOT's tokens are read.
    self.max_masked = max(int(patches * keys.dino.mask_ratio[1]), 1)

  @classmethod
  def check(cls, keys):
    name = "config.objective='dino'"
    dino = keys.dino
    if dino.centering not in CENTERINGS:
      raise errors.ConfigError(
          f"config.dino.centering must be one of {', '.join(CENTERINGS)}, "
          f"got {dino.centering!r}")
    for what in ("global_scale", "local_scale", "mask_ratio"):
      low, high = getattr(dino, what)
      if not 0 <= low <= high <= 1:
        raise errors.ConfigError(
            f"config.dino.{what} must be (low, high) with 0 <= low <= high "
            f"<= 1, got {tuple(getattr(dino, what))!r}")
    for what in ("global_blur_probability", "global_solarize_probability"):
      value = tuple(getattr(dino, what))
      if len(value) != NUM_GLOBAL_CROPS or not all(
          0 <= p <= 1 for p in value):
        raise errors.ConfigError(
            f"config.dino.{what} must be a probability for each of the "
            f"{NUM_GLOBAL_CROPS} global crops, got {value!r}")
    if dino.gram_weight and dino.gram_start >= keys.total_steps:
      raise errors.ConfigError(
          f"config.dino.gram_start={dino.gram_start} is not a step of this "
          f"run (config.total_steps={keys.total_steps}): Gram anchoring "
          "would never start; set it lower, or config.dino.gram_weight=0")
    if keys.accum_steps != 1:
      raise errors.ConfigError(
          f"config.accum_steps={keys.accum_steps} does not apply to {name}: "
          "the teacher's centering normalises over the whole batch at "
          "once; set it to 1 (a smaller batch or more devices, or "
          "config.model.remat_policy, where a batch does not fit)")
    cls.refuse_set(name, "learns from crops of square images without "
                   "labels, one image a row", (
        ("config.model.mpp", keys.model.mpp, False),
        ("config.distill.teacher", keys.distill.teacher, ""),
        ("config.naflex.max_num_patches", keys.naflex.max_num_patches, 0),
        ("config.naflex.packing", keys.naflex.packing, False),
        ("config.mixup.prob", keys.mixup.prob, 0.0),
        ("config.cutmix.prob", keys.cutmix.prob, 0.0),
        ("config.label_smoothing", keys.label_smoothing, 0.0),
        ("config.random_erasing", keys.random_erasing, 0.0),
        ("config.randaugment", keys.randaugment, ""),
        ("config.polyak_decay", keys.polyak_decay, 0.0)))

  @classmethod
  def reads_labels(cls, keys):
    del keys
    return False

  def check_run(self, keys, evaluations):
    super().check_run(keys, evaluations)
    p = self.model.config.patch_size
    if keys.dino.local_crops and keys.dino.local_size % p:
      raise errors.ConfigError(
          f"config.dino.local_size={keys.dino.local_size} must be a "
          f"multiple of the patch size {p}")

  def init_params(self, rng, image_size):
    images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
    return self.model.init(rng, images)["params"]

  def features(self, params, images):
    """The backbone's class token after the final norm (what DINOv2's
    k-NN and linear evaluations read), of the served params: the
    teacher's."""
    return self.model.apply({"params": params}, images,
                            method=self.model.backbone)[0].astype(jnp.float32)

  # --- the batch ---

  def prepare(self, batch, step):
    """The crops and masks of each row, and the step's numbers (which
    travel with the rows: a micro-batch is rows)."""
    images = batch["image"]
    n = images.shape[0]
    global_crops, local_crops = crops_lib.multi_crop(
        images, self.stream(CROP_STREAM, step), self.spec)
    rows = jnp.arange(n)
    masks = jax.vmap(lambda row: self.masks(
        jax.random.fold_in(self.stream(MASK_STREAM, step), row)))(rows)
    learn = (jnp.asarray(step) >= self.dino.freeze_prototypes_steps).astype(
        jnp.float32)
    gram_on = (jnp.asarray(step) >= self.dino.gram_start).astype(
        jnp.float32)
    return {"mask": batch["mask"], "global": global_crops,
            "local": local_crops, "masks": masks,
            "temperature": jnp.full((n,), teacher_temperature(step,
                                                              self.dino)),
            "learn_prototypes": jnp.full((n,), learn),
            "gram_on": jnp.full((n,), gram_on)}

  def masks(self, key):
    """[2, L] bool: each global crop's iBOT mask: with probability
    mask_probability a block mask of a share uniform in mask_ratio."""
    grid = self.spec.global_size // self.model.config.patch_size
    length = grid * grid
    low, high = self.dino.mask_ratio

    def one(key):
      apply_key, share_key, block_key = jax.random.split(key, 3)
      share = jax.random.uniform(share_key, minval=low, maxval=high)
      count = jnp.where(
          jax.random.uniform(apply_key) < self.dino.mask_probability,
          (share * length).astype(jnp.int32), 0)
      return block_mask(block_key, grid, grid, count, length * high)

    return jax.vmap(one)(jax.random.split(key, NUM_GLOBAL_CROPS))

  # --- the teacher ---

  def teach(self, held, micro):
    """The teacher's targets from the served params (the EMA teacher):
    its class tokens' probabilities [n, 2, K] and its masked patches'
    [n, 2, M, K] (zero beyond each crop's masked ones), and their raw
    logits' sums for the running center."""
    teacher = held.served
    model = self.model
    crops = micro["global"]
    n = crops.shape[0]
    flat = crops.reshape(n * NUM_GLOBAL_CROPS, *crops.shape[2:])
    class_tokens, patches = model.apply({"params": teacher}, flat,
                                        method=model.backbone)
    logits = model.apply({"params": teacher}, class_tokens,
                         method=model.project)
    index, valid = first_masked(micro["masks"].reshape(
        n * NUM_GLOBAL_CROPS, -1), self.max_masked)
    masked = jnp.take_along_axis(patches, index[..., None], axis=1)
    patch_logits = model.apply({"params": teacher}, masked,
                               method=model.project_patches)
    temperature = micro["temperature"][0]
    if self.dino.centering == "sinkhorn_knopp":
      probs = dino_losses.sinkhorn_knopp(logits, temperature)
      flat_valid = valid.reshape(-1)
      patch_probs = dino_losses.sinkhorn_knopp(
          patch_logits.reshape(-1, patch_logits.shape[-1]), temperature,
          valid=flat_valid).reshape(patch_logits.shape)
    else:
      probs = dino_losses.softmax_centered(logits, held.carry["dino"],
                                           temperature)
      patch_probs = dino_losses.softmax_centered(
          patch_logits, held.carry["ibot"], temperature) * valid[..., None]
    shape = (n, NUM_GLOBAL_CROPS)
    if self.dino.gram_weight:
      # The Gram teacher's patches, computed once it is in use.
      gram = jax.lax.cond(
          micro["gram_on"][0] > 0,
          lambda: model.apply({"params": held.carry["gram"]}, flat,
                              method=model.backbone)[1],
          lambda: jnp.zeros(patches.shape, patches.dtype))
      micro = {**micro, "gram_patches": jax.lax.stop_gradient(
          gram.reshape(*shape, *gram.shape[1:]))}
    return {**micro,
            "teacher_probs": jax.lax.stop_gradient(
                probs.reshape(*shape, -1)),
            "teacher_patch_probs": jax.lax.stop_gradient(
                patch_probs.reshape(*shape, *patch_probs.shape[1:])),
            "masked_index": index.reshape(*shape, -1),
            "masked_valid": valid.reshape(*shape, -1),
            "teacher_logits": jax.lax.stop_gradient(
                logits.reshape(*shape, -1)),
            "teacher_patch_logits": jax.lax.stop_gradient(
                patch_logits.reshape(*shape, *patch_logits.shape[1:]))}

  # --- the student ---

  def loss(self, params, micro, weights, key):
    model = self.model
    learn = micro["learn_prototypes"][0]
    params = frozen_prototypes(params, learn)
    crops = micro["global"]
    n = crops.shape[0]
    keys = jax.random.split(key, 2)
    flat = crops.reshape(n * NUM_GLOBAL_CROPS, *crops.shape[2:])
    masks = micro["masks"].reshape(n * NUM_GLOBAL_CROPS, -1)
    class_tokens, patches = model.apply(
        {"params": params}, flat, train=True, masks=masks,
        method=model.backbone, rngs={"dropout": keys[0]})
    logits = model.apply({"params": params}, class_tokens,
                         method=model.project).reshape(n, NUM_GLOBAL_CROPS, -1)
    index = micro["masked_index"].reshape(n * NUM_GLOBAL_CROPS, -1)
    masked = jnp.take_along_axis(patches, index[..., None], axis=1)
    patch_logits = model.apply({"params": params}, masked,
                               method=model.project_patches)
    patch_logits = patch_logits.reshape(n, NUM_GLOBAL_CROPS,
                                        *patch_logits.shape[1:])
    temperature = self.dino.student_temperature
    teacher = micro["teacher_probs"]

    # DINO: global crop i against the teacher's other global crop ...
    student = jnp.swapaxes(logits, 0, 1)  # [2, n, K]
    swapped = jnp.swapaxes(teacher[:, ::-1], 0, 1)
    dino = sum(dino_losses.cross_entropies(student[i], swapped[i],
                                           temperature)
               for i in range(NUM_GLOBAL_CROPS))
    terms = NUM_GLOBAL_CROPS * (NUM_GLOBAL_CROPS - 1)
    # ... and each local crop against both.
    local = micro["local"]
    if local.shape[1]:
      count = local.shape[1]
      flat_local = local.reshape(n * count, *local.shape[2:])
      local_tokens, _ = model.apply(
          {"params": params},
          dino_lib.crops_as_patches(flat_local, model.config.patch_size),
          train=True, method=model.backbone, rngs={"dropout": keys[1]})
      local_logits = model.apply({"params": params}, local_tokens,
                                 method=model.project)
      local_logits = jnp.swapaxes(local_logits.reshape(n, count, -1), 0, 1)
      dino = dino + dino_losses.pairwise_cross_entropies(
          local_logits, jnp.swapaxes(teacher, 0, 1), temperature)
      terms += count * NUM_GLOBAL_CROPS
    dino = dino / terms

    # KoLeo over the whole batch, each global crop apart.
    # Rows that hold no image (mask 0) are no one's neighbour.
    counted = weights > 0
    tokens = class_tokens.reshape(n, NUM_GLOBAL_CROPS, -1)
    koleo = sum(koleo_per_row(tokens[:, i], counted)
                for i in range(NUM_GLOBAL_CROPS))

    # iBOT: each crop's mean over its masked patches, the crops' mean.
    valid = micro["masked_valid"]
    per_patch = dino_losses.cross_entropies(
        patch_logits, micro["teacher_patch_probs"], temperature)
    ibot = ((per_patch * valid).sum(-1) / jnp.maximum(valid.sum(-1), 1)
            ).sum(-1) / NUM_GLOBAL_CROPS

    d = self.dino
    per_image = (d.dino_weight * dino + d.koleo_weight * koleo
                 + d.ibot_weight * ibot)
    parts = {"dino_loss": (weights * dino).sum(),
             "koleo_loss": (weights * koleo).sum(),
             "ibot_loss": (weights * ibot).sum()}
    if d.gram_weight:
      # Gram anchoring: each global crop's patches, all of them.
      teacher_patches = micro["gram_patches"].reshape(patches.shape)
      per_crop = jax.vmap(lambda s, t: dino_losses.gram_loss(
          s[None], t[None]))(patches, teacher_patches)
      gram = per_crop.reshape(n, NUM_GLOBAL_CROPS).mean(-1) * micro[
          "gram_on"]
      per_image = per_image + d.gram_weight * gram
      parts["gram_loss"] = (weights * gram).sum()
    return (weights * per_image).sum(), parts

  # --- state beside the params: the running centers, the Gram teacher ---

  def init_carry(self, params):
    carry = {}
    if self.dino.centering == "center":
      k = self.model.head.prototypes
      carry.update(dino=jnp.zeros((k,), jnp.float32),
                   ibot=jnp.zeros((k,), jnp.float32))
    if self.dino.gram_weight:
      # In the params' boxes: the snapshot is sharded as they are.
      carry["gram"] = dino_lib.backbone_params(params)
    return carry or None

  def observe(self, micro, weights):
    if self.dino.centering != "center":
      return {}
    valid = micro["masked_valid"].astype(jnp.float32)
    patch_sums = (micro["teacher_patch_logits"] * valid[..., None]).sum(
        axis=(1, 2))
    return {"dino": weights @ micro["teacher_logits"].mean(axis=1),
            "ibot": weights @ patch_sums,
            "ibot_count": weights @ valid.sum(axis=(1, 2))}

  def update_carry(self, carry, observed, step, served):
    carry = dict(carry)
    if self.dino.centering == "center":
      momentum = self.dino.center_momentum
      ibot = observed["ibot"] / jnp.maximum(observed["ibot_count"], 1e-30)
      carry["dino"] = dino_losses.updated_center(carry["dino"],
                                                 observed["dino"], momentum)
      carry["ibot"] = jnp.where(observed["ibot_count"] > 0,
                                dino_losses.updated_center(
                                    carry["ibot"], ibot, momentum),
                                carry["ibot"])
    if self.dino.gram_weight:
      kept = carry["gram"]
      carry["gram"] = jax.lax.cond(
          self.gram_taken_before(step + 1),
          lambda: dino_lib.backbone_params(served), lambda: kept)
    return carry

  def gram_taken_before(self, step):
    """Whether the Gram teacher of `step` is a new snapshot: `step` is
    gram_start, or one of its gram_max_updates refreshes after it."""
    d = self.dino
    since = jnp.asarray(step) - d.gram_start
    return ((since >= 0) & (since % d.gram_update_every == 0)
            & (since // d.gram_update_every <= d.gram_max_updates))

  # --- the teacher: what the run serves ---

  def init_served(self, params, carry, decay):
    del carry, decay
    return params

  def update_served(self, served, params, carry, decay, step):
    del carry, decay
    momentum = teacher_momentum(step, self.dino.momentum, self.total_steps)
    return jax.tree.map(
        lambda t, s: (momentum * t.astype(jnp.float32) + (1 - momentum)
                      * s.astype(jnp.float32)).astype(t.dtype),
        served, params)

  def flops_per_image(self, image_size, num_patches=None, slots=1):
    """The student's forward and backward on every crop and the teacher's
    forward on the global ones, with the heads (iBOT's on the most
    masked patches a crop may hold)."""
    del num_patches, slots
    backbone = models.VisionTransformer(num_classes=0,
                                        config=self.model.config)
    per_global = flops.flops_per_image(backbone, image_size)
    per_local = (flops.flops_per_image(backbone, self.spec.local_size)
                 if self.spec.num_local else 0)
    head = self.model.head
    d = self.model.config.hidden_size
    widths = ([d] + [head.hidden_size] * (head.layers - 1)
              + [head.bottleneck, head.prototypes])
    per_token = sum(2 * a * b for a, b in zip(widths, widths[1:]))
    student = (NUM_GLOBAL_CROPS * (per_global + per_token * (
        1 + self.max_masked)) + self.spec.num_local * (per_local + per_token))
    teacher = NUM_GLOBAL_CROPS * (per_global
                                  + per_token * (1 + self.max_masked))
    if self.dino.gram_weight:  # the Gram teacher, counted for every step
      teacher += NUM_GLOBAL_CROPS * per_global
    return flops.TRAIN_FORWARDS * student + teacher


def koleo_per_row(tokens, counted):
  """[n]: each counted row's -log(distance to its nearest other counted
  row + eps), as KoLeoLoss measures it (0 for rows not counted)."""
  eps = dino_losses.KOLEO_EPSILON
  return jnp.where(counted, -jnp.log(
      dino_losses.koleo_distances(tokens, counted=counted) + eps), 0.0)


def frozen_prototypes(params, learn):
  """`params` whose heads' prototypes (DINOv2's "last layer") pass
  `learn` (1 or 0) of their gradient: DINOv2 freezes them for the first
  epoch."""
  def scaled(value):
    value = nn.meta.unbox(value) if isinstance(
        value, nn.meta.AxisMetadata) else value
    return learn * value + (1 - learn) * jax.lax.stop_gradient(value)

  out = dict(params)
  for head in dino_lib.HEADS:
    if head in out:
      out[head] = {**out[head], **{
          name: scaled(out[head][name])
          for name in ("prototypes", "prototype_scale")}}
  return out
