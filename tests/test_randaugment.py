"""RandAugment: every op's shapes and dtype, hand-computed values, seeding."""

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from vit_jax import errors
from vit_jax.data import randaugment

SHAPES = ((8, 8, 3), (17, 23, 3), (64, 64, 3))
MAGNITUDES = (0, 5, 10)
SEED = tf.constant([7, 11])
# Ops that draw nothing: their output depends on the image and magnitude only.
DETERMINISTIC = ("AutoContrast", "Equalize", "Invert", "Posterize",
                 "Solarize", "SolarizeAdd", "Color", "Contrast", "Brightness",
                 "Sharpness")


def random_image(shape, seed=0):
  rng = np.random.default_rng(seed)
  return rng.integers(0, 256, shape, dtype=np.uint8)


def apply(name, image, magnitude, seed=SEED):
  return randaugment.OPS[name](tf.constant(image), magnitude, seed).numpy()


def test_ops_are_the_references_sixteen_in_its_order():
  assert list(randaugment.OPS) == [
      "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
      "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
      "TranslateX", "TranslateY", "Cutout", "SolarizeAdd"]


@pytest.mark.parametrize("name", list(randaugment.OPS))
def test_op_keeps_shape_and_dtype_eagerly_and_in_tf_data(name):
  op = randaugment.OPS[name]
  images = [random_image(shape, i) for i, shape in enumerate(SHAPES)]
  eager = [[op(tf.constant(image), m, SEED).numpy() for m in MAGNITUDES]
           for image in images]
  for image, outputs in zip(images, eager):
    for output in outputs:
      assert output.dtype == np.uint8
      assert output.shape == image.shape

  # Unknown height and width, as after decoding; same pixels as eagerly.
  dataset = tf.data.Dataset.from_generator(
      lambda: iter(images),
      output_signature=tf.TensorSpec([None, None, 3], tf.uint8))
  dataset = dataset.map(
      lambda image: tuple(op(image, m, SEED) for m in MAGNITUDES))
  for spec in dataset.element_spec:
    assert spec.shape.as_list() == [None, None, 3]
    assert spec.dtype == tf.uint8
  for outputs, expected in zip(dataset.as_numpy_iterator(), eager):
    for output, expected_output in zip(outputs, expected):
      np.testing.assert_array_equal(output, expected_output)


@pytest.mark.parametrize("shape", [(1, 1, 3), (2, 5, 3), (3, 3, 3)])
def test_ops_take_tiny_images(shape):
  image = random_image(shape)
  for name in randaugment.OPS:
    assert apply(name, image, 10).shape == shape


def test_invert():
  image = random_image((5, 6, 3))
  np.testing.assert_array_equal(apply("Invert", image, 3), 255 - image)


@pytest.mark.parametrize("name",
                         ["Brightness", "Color", "Contrast", "Sharpness"])
def test_enhance_ops_at_factor_one_are_the_identity(name):
  image = random_image((9, 10, 3))
  np.testing.assert_array_equal(apply(name, image, 5), image)


def test_brightness_scales_by_its_factor():
  image = np.array([[[0, 10, 100], [101, 134, 255]]], np.uint8)
  # Magnitude 10: factor 1.9, rounded, saturating at 255.
  expected = [[[0, 19, 190], [192, 255, 255]]]
  np.testing.assert_array_equal(apply("Brightness", image, 10), expected)


def test_sharpness_sharpens_inside_the_border():
  image = np.zeros((3, 4, 3), np.uint8)
  image[1, 1] = 130
  output = apply("Sharpness", image, 10)
  # Smoothed: 5 * 130 / 13 = 50 at (1, 1), 130 / 13 = 10 at (1, 2); factor
  # 1.9 moves each away from it. The border stays.
  expected = np.zeros_like(image)
  expected[1, 1] = 50 + 1.9 * (130 - 50)
  np.testing.assert_array_equal(output, expected)


def test_color_and_contrast_keep_gray_and_flat_images():
  gray = np.repeat(random_image((5, 6, 1)), 3, axis=-1)
  flat = np.full((5, 6, 3), [40, 90, 200], np.uint8)
  for magnitude in MAGNITUDES:
    np.testing.assert_array_equal(apply("Color", gray, magnitude), gray)
  # Magnitude 0: factor 0.1, so 0.1 x + 0.9 mean; the mean gray is
  # 0.2989 * 40 + 0.587 * 90 + 0.114 * 200 = 87.586.
  np.testing.assert_array_equal(apply("Contrast", flat, 0),
                                np.round(0.1 * flat + 0.9 * 87.586))


def test_solarize_inverts_from_its_threshold():
  image = np.array([[[0, 127, 128], [129, 200, 255]]], np.uint8)
  # Magnitude 5: threshold int(0.5 * 256) = 128.
  np.testing.assert_array_equal(apply("Solarize", image, 5),
                                [[[0, 127, 127], [126, 55, 0]]])
  # Magnitude 10: threshold 256, nothing changes (the reference's quirk).
  np.testing.assert_array_equal(apply("Solarize", image, 10), image)


def test_solarize_add_adds_below_128():
  image = np.array([[[0, 127, 128], [20, 200, 255]]], np.uint8)
  # Magnitude 10: + 110 to values below 128, saturating.
  np.testing.assert_array_equal(apply("SolarizeAdd", image, 10),
                                [[[110, 237, 128], [130, 200, 255]]])


def test_posterize_keeps_the_top_bits():
  image = np.array([[[0b11111111, 0b10110101, 0b01101100]]], np.uint8)
  # Magnitude 10: 4 bits; 5: 2 bits; 0: 0 bits, which keeps the top bit as
  # the reference does (TensorFlow clamps its shift by 8 to 7).
  np.testing.assert_array_equal(apply("Posterize", image, 10),
                                [[[0b11110000, 0b10110000, 0b01100000]]])
  np.testing.assert_array_equal(apply("Posterize", image, 5),
                                [[[0b11000000, 0b10000000, 0b01000000]]])
  np.testing.assert_array_equal(apply("Posterize", image, 0),
                                [[[0b10000000, 0b10000000, 0]]])


def test_auto_contrast_stretches_each_channel():
  image = random_image((6, 7, 3))
  image[..., 0] = np.linspace(50, 100, 42).reshape(6, 7).round()
  image[..., 2] = 33  # Flat: left as is.
  output = apply("AutoContrast", image, 0)
  assert output[..., 0].min() == 0 and output[..., 0].max() == 255
  np.testing.assert_array_equal(
      output[..., 0], np.round((image[..., 0] - 50.0) * 255 / 50))
  np.testing.assert_array_equal(output[..., 2], image[..., 2])


def test_equalize_keeps_a_flat_histogram_and_matches_pil():
  flat = np.stack([np.arange(256).reshape(16, 16)] * 3, -1).astype(np.uint8)
  np.testing.assert_array_equal(apply("Equalize", flat, 0), flat)
  for shape in SHAPES:
    image = random_image(shape)
    image[..., 1] = image[..., 1] // 8 + 100  # A narrow range.
    image[..., 2] = 9  # One value: step 0, unchanged.
    np.testing.assert_array_equal(
        apply("Equalize", image, 0),
        np.asarray(ImageOps.equalize(Image.fromarray(image))))


def test_translate_x_moves_by_whole_pixels_and_fills_128():
  image = np.zeros((6, 14, 3), np.uint8)
  image[2, 7] = [10, 20, 30]
  # Magnitude 10: round(100 / 224 * 14) = round(6.25) = 6 pixels.
  shifts = set()
  for i in range(8):
    output = apply("TranslateX", image, 10, tf.constant([i, 0]))
    shift = 6 if output[:, 0].max() == 128 else -6
    shifts.add(shift)
    expected = np.full_like(image, 128)
    if shift > 0:
      expected[:, 6:] = image[:, :-6]
    else:
      expected[:, :-6] = image[:, 6:]
    np.testing.assert_array_equal(output, expected)
    np.testing.assert_array_equal(output[2, 7 + shift], [10, 20, 30])
  assert shifts == {6, -6}


def test_translate_y_moves_along_y():
  image = random_image((14, 5, 3))
  output = apply("TranslateY", image, 10)
  moved_down = np.array_equal(output[6:], image[:-6])
  moved_up = np.array_equal(output[:-6], image[6:])
  assert moved_down or moved_up
  filled = output[:6] if moved_down else output[-6:]
  assert (filled == 128).all()


@pytest.mark.parametrize("name", ["Rotate", "ShearX", "ShearY", "TranslateX",
                                  "TranslateY", "Cutout"])
def test_geometric_ops_at_magnitude_0_are_the_identity(name):
  image = random_image((17, 23, 3))
  np.testing.assert_array_equal(apply(name, image, 0), image)


def test_rotate_turns_about_the_centre():
  image = random_image((9, 9, 3))
  output = apply("Rotate", image, 10)
  np.testing.assert_array_equal(output[4, 4], image[4, 4])
  assert (output == 128).all(axis=-1)[0, 0]  # A corner leaves the image.
  assert not np.array_equal(output, image)


def test_cutout_fills_a_square_with_128():
  image = random_image((64, 64, 3)) // 2  # No 128s of its own.
  sides = set()
  for i in range(8):
    output = apply("Cutout", image, 10, tf.constant([i, 1]))
    changed = (output != image).any(axis=-1)
    assert (output[changed] == 128).all()
    rows, columns = np.nonzero(changed)
    height, width = np.ptp(rows) + 1, np.ptp(columns) + 1
    # A rectangle: 2 * round(40 / 224 * 64) = 22 on a side, less if clipped.
    assert changed.sum() == height * width
    assert 0 < height <= 22 and 0 < width <= 22
    sides.update((height, width))
  assert 22 in sides


def test_randaugment_is_deterministic_per_seed():
  image = random_image((17, 23, 3))
  outputs = [randaugment.randaugment(tf.constant(image), tf.constant([i, 5]),
                                     2, 10).numpy() for i in range(20)]
  again = randaugment.randaugment(tf.constant(image), tf.constant([0, 5]), 2,
                                  10).numpy()
  np.testing.assert_array_equal(again, outputs[0])
  distinct = {output.tobytes() for output in outputs}
  assert len(distinct) >= 15
  for output in outputs:
    assert output.dtype == np.uint8 and output.shape == image.shape


def test_randaugment_with_no_layers_is_the_identity():
  image = random_image((8, 8, 3))
  output = randaugment.randaugment(tf.constant(image), SEED, 0, 10)
  np.testing.assert_array_equal(output, image)
  assert randaugment.chosen_ops(SEED, 0).shape == (0,)


def test_every_op_gets_chosen_and_is_the_one_applied():
  choices = [randaugment.chosen_ops(tf.constant([i, 3]), 2).numpy()
             for i in range(100)]
  assert set(np.concatenate(choices)) == set(range(len(randaugment.OPS)))
  # With one layer, the output is the chosen op's.
  image = random_image((8, 8, 3))
  names = list(randaugment.OPS)
  seen = set()
  for i in range(100):
    seed = tf.constant([i, 4])
    name = names[int(randaugment.chosen_ops(seed, 1)[0])]
    if name in DETERMINISTIC and name not in seen:
      seen.add(name)
      np.testing.assert_array_equal(
          randaugment.randaugment(tf.constant(image), seed, 1, 9),
          apply(name, image, 9))
  assert len(seen) >= 5


def test_randaugment_in_tf_data_matches_eager():
  images = [random_image(shape, i) for i, shape in enumerate(SHAPES)]
  seeds = tf.constant([[i, 2] for i in range(len(images))])
  dataset = tf.data.Dataset.zip((
      tf.data.Dataset.from_generator(
          lambda: iter(images),
          output_signature=tf.TensorSpec([None, None, 3], tf.uint8)),
      tf.data.Dataset.from_tensor_slices(seeds)))
  dataset = dataset.map(
      lambda image, seed: randaugment.randaugment(image, seed, 2, 10))
  assert dataset.element_spec.shape.as_list() == [None, None, 3]
  for output, image, seed in zip(dataset.as_numpy_iterator(), images, seeds):
    np.testing.assert_array_equal(
        output, randaugment.randaugment(tf.constant(image), seed, 2, 10))


def test_randaugment_keeps_a_static_shape():
  spec = tf.TensorSpec([224, 224, 3], tf.uint8)
  traced = tf.function(lambda image: randaugment.randaugment(
      image, SEED, 2, 10)).get_concrete_function(spec)
  assert traced.structured_outputs.shape.as_list() == [224, 224, 3]


@pytest.mark.parametrize("num_layers, magnitude", [
    (-1, 10), (1.0, 10), (True, 10), ("2", 10), (2, -0.5), (2, 10.5),
    (2, float("nan")), (2, "10"), (2, None)])
def test_check_refuses_bad_arguments(num_layers, magnitude):
  with pytest.raises(errors.InputError, match="randaugment"):
    randaugment.check(num_layers, magnitude)
  with pytest.raises(errors.InputError):
    randaugment.randaugment(tf.zeros([8, 8, 3], tf.uint8), SEED, num_layers,
                            magnitude)


def test_check_accepts_the_range():
  for num_layers, magnitude in [(0, 0), (2, 10), (3, 9.5), (np.int64(1), 5)]:
    randaugment.check(num_layers, magnitude)
