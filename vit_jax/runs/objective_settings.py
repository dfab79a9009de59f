"""The config sections of the objectives that train more than a ViT
(runs/settings.py holds the rest of the config): config.mae, config.dino
and config.image_text. Each is its recipe's own keys, then the sizes of
the part its model adds (MAE's decoder, DINO's heads, the text tower),
derived from the dataclass where the model declares them.
"""

import dataclasses

from vit_jax.models import (
  dino as dino_lib,
  mae as mae_lib,
  options,
  text as text_lib,
)

key = options.key
AS_DEFAULT = options.AS_DEFAULT


def _mae_section():
  """config.mae: the mask ratio and loss, then each of models/mae.py's
  DecoderSizes fields as it declares it, named decoder_<field>."""
  fields = [
      ("mask_ratio", float, key(
          0.75, "the share of each image's patches removed", at_least=0.0,
          below=1.0, before=AS_DEFAULT)),
      ("norm_pix_loss", bool, key(
          True, "predict each patch's pixels normalised by its own mean and "
          "variance", before=AS_DEFAULT))]
  return _section_with_sizes(
      "MAE", fields, mae_lib.DecoderSizes, mae_lib.SETTINGS_PREFIX,
      "config.mae: masked autoencoders' pre-training (config.objective "
      "\"mae\"; training/objectives/mae.py), He et al.'s defaults.")


def _section_with_sizes(name, fields, sizes, prefix, doc):
  """A config section of `fields`, then each field of the dataclass
  `sizes` as the model's module declares it, named prefix + its name."""
  fields = fields + [(prefix + field.name, field.type,
                      key(field.default, **field.metadata))
                     for field in dataclasses.fields(sizes)]
  return dataclasses.make_dataclass(
      name, fields, frozen=True,
      namespace={"__module__": __name__, "__doc__": doc})


MAE = _mae_section()


def _dino_section():
  """config.dino: DINOv2's recipe (its ssl_default_config.yaml), then each
  of models/dino.py's HeadSizes fields as it declares it, named
  head_<field>."""
  fields = [
      ("centering", str, key(
          "center", "the teacher's centering: center (DINO's running "
          "mean) or sinkhorn_knopp (DINOv2's released models)",
          before=AS_DEFAULT)),
      ("center_momentum", float, key(
          0.9, "the running center's momentum", at_least=0.0, below=1.0,
          before=AS_DEFAULT)),
      ("momentum", float, key(
          0.992, "the teacher's EMA momentum at step 0, to 1 by a cosine "
          "(the released L/g: 0.994)", at_least=0.0, at_most=1.0,
          before=AS_DEFAULT)),
      ("student_temperature", float, key(
          0.1, "the student's softmax temperature", at_least=0.0,
          before=AS_DEFAULT)),
      ("teacher_temperature", float, key(
          0.07, "the teacher's after its warm-up", at_least=0.0,
          before=AS_DEFAULT)),
      ("warmup_teacher_temperature", float, key(
          0.04, "the teacher's at step 0", at_least=0.0,
          before=AS_DEFAULT)),
      ("teacher_warmup_steps", int, key(
          0, "steps of the teacher temperature's linear warm-up (DINOv2: "
          "30 epochs)", at_least=0, before=AS_DEFAULT)),
      ("freeze_prototypes_steps", int, key(
          0, "steps the heads' prototypes are not trained for (DINOv2: one "
          "epoch)", at_least=0, before=AS_DEFAULT)),
      ("local_crops", int, key(
          8, "local crops of each image", at_least=0, before=AS_DEFAULT)),
      ("local_size", int, key(
          96, "the local crops' side (98 for patch 14)", at_least=1,
          before=AS_DEFAULT)),
      ("global_scale", tuple, key(
          (0.32, 1.0), "the global crops' share of the image's area",
          before=AS_DEFAULT)),
      ("local_scale", tuple, key(
          (0.05, 0.32), "the local crops' share of the image's area",
          before=AS_DEFAULT)),
      ("blur_sigma", tuple, key(
          (0.1, 2.0), "the crops' Gaussian blur's sigma range in pixels "
          "(DINOv2's, for 224-px crops)", before=AS_DEFAULT)),
      # DINOv2's augmentations.py, which its configs do not set: keys for
      # images whose meaning a flip or a colour changes.
      ("flip_probability", float, key(
          0.5, "each crop's horizontal flip's", at_least=0.0, at_most=1.0,
          before=AS_DEFAULT)),
      ("jitter_probability", float, key(
          0.8, "each crop's colour jitter's", at_least=0.0, at_most=1.0,
          before=AS_DEFAULT)),
      ("grey_probability", float, key(
          0.2, "each crop's greyscale's", at_least=0.0, at_most=1.0,
          before=AS_DEFAULT)),
      ("global_blur_probability", tuple, key(
          (1.0, 0.1), "the blur's on global crops 0 and 1 (the released "
          "models were trained with (0.0, 0.9): docs/dino.md)",
          before=AS_DEFAULT)),
      ("local_blur_probability", float, key(
          0.5, "the blur's on each local crop", at_least=0.0, at_most=1.0,
          before=AS_DEFAULT)),
      ("global_solarize_probability", tuple, key(
          (0.0, 0.2), "the solarisation's on global crops 0 and 1",
          before=AS_DEFAULT)),
      ("dino_weight", float, key(1.0, "the DINO loss's weight",
                                 at_least=0.0, before=AS_DEFAULT)),
      ("koleo_weight", float, key(0.1, "the KoLeo loss's weight",
                                  at_least=0.0, before=AS_DEFAULT)),
      ("ibot_weight", float, key(1.0, "the iBOT loss's weight",
                                 at_least=0.0, before=AS_DEFAULT)),
      ("mask_probability", float, key(
          0.5, "the share of global crops that iBOT masks", at_least=0.0,
          at_most=1.0, before=AS_DEFAULT)),
      ("mask_ratio", tuple, key(
          (0.1, 0.5), "a masked crop's share of masked patches, uniform in "
          "(low, high)", before=AS_DEFAULT)),
      ("ibot_separate_head", bool, key(
          False, "iBOT's head apart from DINO's (the released L/g: True)",
          before=AS_DEFAULT)),
      ("gram_weight", float, key(
          0.0, "DINOv3's Gram anchoring: its loss's weight from gram_start "
          "on (0: off; DINOv3's anchoring phase: 2.0)", at_least=0.0,
          before=AS_DEFAULT)),
      ("gram_start", int, key(
          1, "the step whose Gram teacher is the first, the EMA teacher of "
          "the step before it (DINOv3: 1,000,000 of 1,200,000)",
          at_least=1, before=AS_DEFAULT)),
      ("gram_update_every", int, key(
          10000, "steps between the Gram teacher's refreshes from the EMA "
          "teacher (DINOv3: 10,000)", at_least=1, before=AS_DEFAULT)),
      ("gram_max_updates", int, key(
          3, "refreshes after the first Gram teacher (DINOv3: 3)",
          at_least=0, before=AS_DEFAULT))]
  return _section_with_sizes(
      "DINO", fields, dino_lib.HeadSizes, dino_lib.SETTINGS_PREFIX,
      "config.dino: self-distillation's pre-training (config.objective "
      "\"dino\"; training/objectives/dino.py), DINOv2's defaults.")


DINO = _dino_section()


def _image_text_section():
  """config.image_text: SigLIP's recipe (big_vision's siglip configs),
  then each of models/text.py's TextSizes fields as it declares it, named
  text_<field>."""
  fields = [
      ("loss", str, key(
          "sigmoid", "sigmoid (SigLIP's) or softmax (CLIP's)",
          choices=("sigmoid", "softmax"), before=AS_DEFAULT)),
      ("chunked", bool, key(
          True, "the sigmoid loss a block of texts at a time, passed "
          "round the devices (no device holds the batch x batch logits)",
          before=AS_DEFAULT)),
      ("tokenizer", str, key(
          "", "a SentencePiece .model file (SigLIP's), or captions:N: N "
          "pieces trained on the run's captions when it starts",
          before=AS_DEFAULT)),
      ("templates", tuple, key(
          (), "a labelled dataset's captions: each template, {} for a "
          "class name; (): a captioned dataset's own captions",
          before=AS_DEFAULT)),
      ("class_names", tuple, key(
          (), "each class's names for the templates, '|' between "
          "synonyms ('seven|7')", before=AS_DEFAULT))]
  return _section_with_sizes(
      "ImageText", fields, text_lib.TextSizes, text_lib.SETTINGS_PREFIX,
      "config.image_text: image-text pre-training (config.objective "
      "\"image_text\"; training/objectives/image_text.py), SigLIP's "
      "defaults.")


ImageText = _image_text_section()
