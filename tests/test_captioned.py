"""Captioned images (data/captioned.py, `captions:ROOT`): the JSON-lines
folder prepared as a TFDS dataset, one caption drawn per image at each
place in the stream and tokenised in the input pipeline, resumed as it
was; a two-tower run trained on it; retrieval recall."""

import json
import os

import numpy as np
import pytest
from sklearn import datasets

from configs.siglip import digits as siglip_digits
from tests.test_image_text import siglip_config
from tests.util import check_config, logged, run_training
from vit_jax import errors
from vit_jax.data import (
  captioned,
  captions as captions_lib,
  pipeline as pipeline_lib,
  preprocess,
  sources,
  tokenizer as tokenizer_lib,
)
from vit_jax.data.lazy_tensorflow import tf
from vit_jax.training.evaluators import retrieval

LENGTH = 8


def captions_of(label):
  """Each digit's captions: the training templates with its word."""
  word = siglip_digits.WORDS[label]
  return [template.format(word) for template in
          siglip_digits.TRAIN_TEMPLATES[:3]]


@pytest.fixture(scope="module")
def captioned_root(tmp_path_factory):
  """96 training and 32 test digits as PNG files, train.jsonl giving
  some one caption and some three, and one file that is no image."""
  root = tmp_path_factory.mktemp("captioned")
  digits = datasets.load_digits()
  (root / "images").mkdir()
  splits = {"train": range(96), "test": range(96, 128)}
  for split, indices in splits.items():
    lines = []
    for index in indices:
      grey = np.round(digits.images[index] * 255 / 16).astype(np.uint8)
      png = tf.io.encode_png(np.repeat(grey[..., None], 3, -1)).numpy()
      name = f"images/{index}.png"
      (root / name).write_bytes(png)
      texts = captions_of(int(digits.target[index]))
      lines.append({"image": name, "caption": texts[0]} if index % 2 else
                   {"image": name, "captions": texts})
    if split == "train":
      (root / "images/broken.png").write_bytes(b"not a png")
      lines.append({"image": "images/broken.png", "caption": "nothing"})
    (root / f"{split}.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in lines))
  texts = [text for label in range(10) for text in captions_of(label)]
  (root / "spiece.model").write_bytes(tokenizer_lib.train(texts, 64))
  return str(root)


def test_a_captioned_folder_is_a_dataset_of_images_and_captions(
    captioned_root, tmp_path):
  source = sources.lookup(f"captions:{captioned_root}", str(tmp_path))
  assert source.num_examples("train") == 96  # the broken file left out
  assert source.num_examples("test") == 32
  assert source.captions is not None and source.num_classes == 0
  # Even lines give "captions" (3), odd ones "caption".
  counts = [len(texts) for texts in sources.captions_in(source, "train")]
  assert sorted(counts) == [1] * 48 + [3] * 48


@pytest.mark.parametrize("line, message", [
    ("{\"image\": \"a.png\"}", "give \"caption\""),
    ("not json", "not JSON"),
    ("{\"caption\": \"x\"}", "an \"image\" path")])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, message):
  (tmp_path / "train.jsonl").write_text(
      "{\"image\": \"a.png\", \"caption\": \"x\"}\n" + line + "\n")
  with pytest.raises(errors.InputError,
                     match=f"train.jsonl, line 2: .*{message}"):
    captioned.make_config(str(tmp_path))


def test_a_run_without_templates_on_a_dataset_without_captions_is_refused(
    digits_data_dir):
  config = siglip_config(digits_data_dir, **{
      "image_text.templates": (),
      "image_text.tokenizer": "/nowhere/spiece.model"})
  with pytest.raises(errors.ConfigError, match="digits has no captions"):
    check_config(config)


def batches_of(root, data_dir, count, **overrides):
  tokenizer = tokenizer_lib.Tokenizer.read(
      os.path.join(root, "spiece.model"), LENGTH)
  return list(pipeline_lib.train_dataset(
      sources.lookup(f"captions:{root}", data_dir), "train", batch_size=32,
      image_size=8, augmentation=preprocess.augmentation(""), seed=1,
      tokenize=tokenizer.encode_bytes, **overrides).take(count)
              .as_numpy_iterator()), tokenizer


def test_each_row_draws_one_of_its_captions_and_resumes_so(
    captioned_root, tmp_path):
  """Tokens [rows, length], each row's one of its image's captions; over
  the epochs every caption of a three-caption image comes; a stream
  resumed at step 5 continues the uninterrupted one."""
  straight, tokenizer = batches_of(captioned_root, str(tmp_path), 12)
  assert straight[0]["tokens"].shape == (32, LENGTH)
  assert "caption" not in straight[0]
  source = sources.lookup(f"captions:{captioned_root}", str(tmp_path))
  allowed = {index: {tuple(row) for row in tokenizer.encode(texts)}
             for index, texts in enumerate(
                 sources.captions_in(source, "train"))}
  seen = {}
  for batch in straight:
    for index, tokens in zip(batch["index"], batch["tokens"]):
      assert tuple(tokens) in allowed[index]
      seen.setdefault(index, set()).add(tuple(tokens))
  assert max(len(drawn) for drawn in seen.values()) > 1
  resumed, _ = batches_of(captioned_root, str(tmp_path), 4, start_step=5)
  for batch, expected in zip(resumed, straight[5:9]):
    np.testing.assert_array_equal(batch["tokens"], expected["tokens"])
    np.testing.assert_array_equal(batch["image"], expected["image"])


def test_a_two_tower_run_trains_on_a_captioned_folder(captioned_root,
                                                      digits_data_dir,
                                                      tmp_path):
  """The run's texts are the folder's (no templates); zero-shot on the
  digits' test split and retrieval on the folder's test split."""
  config = siglip_config(
      digits_data_dir, dataset=f"captions:{captioned_root}",
      **{"image_text.templates": (),
         "image_text.tokenizer": os.path.join(captioned_root, "spiece.model"),
         "image_text.text_length": LENGTH, "total_steps": 4,
         "evaluators.zero_shot.every": 4,
         "evaluators.seen_templates.every": 0})
  config.evaluators["retrieval"] = {
      "kind": "retrieval", "every": 4,
      "datasets": {f"captions:{captioned_root}": "test", "digits": "test"},
      "templates": ("this is {}",)}
  last = run_training(config, str(tmp_path / "run"))
  assert sorted(logged(str(tmp_path / "run"))) == [1, 2, 3, 4]
  assert 0 <= last["zero_shot/digits_accuracy"] <= 1
  for dataset in (f"captions:{captioned_root}", "digits"):
    for direction in ("image_to_text", "text_to_image"):
      recalls = [last[f"retrieval/{dataset}_{direction}_r@{k}"]
                 for k in (1, 5, 10)]
      assert 0 <= recalls[0] <= recalls[1] <= recalls[2] <= 1


def test_recall_counts_a_row_found_when_a_relevant_column_is_in_its_top_k():
  similarity = np.array([[0.9, 0.1, 0.5], [0.2, 0.3, 0.8]])
  relevant = np.array([[False, False, True], [True, False, False]])
  assert retrieval.recall(similarity, relevant, (1, 2, 3)) == {
      1: 0.0, 2: 0.5, 3: 1.0}
  # Ties: the earlier column first.
  assert retrieval.recall(np.ones((1, 2)), np.array([[False, True]]),
                          (1,)) == {1: 0.0}


def test_class_captions_are_what_labelled_retrieval_searches():
  captions = captions_lib.of_classes(("a {}",), ("cat|kitty", "dog"))
  assert captions == [["a cat", "a kitty"], ["a dog"]]
