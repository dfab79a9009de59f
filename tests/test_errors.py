"""An InputError's key is data, and str() alone composes what a user reads
(vit_jax/errors.py)."""

import errno

from vit_jax import errors


def test_the_key_and_value_lead_the_message():
  assert str(errors.InputError("gone")) == "gone"
  refused = errors.InputError("unknown augmentation 'x'", key="augment")
  assert (refused.key, refused.message) == ("augment",
                                            "unknown augmentation 'x'")
  assert str(refused) == "augment: unknown augmentation 'x'"
  assert str(errors.InputError("no run", key="config.init_from",
                               value="/w")) == "config.init_from='/w': no run"


def test_a_config_error_of_another_adds_where_it_was_met():
  inner = errors.InputError("must be in (0, 1]", key="eval_crop_fraction")
  outer = errors.ConfigError.of(inner, "config")
  assert isinstance(outer, errors.ConfigError)
  assert outer.key == "config.eval_crop_fraction"
  assert str(outer) == "config.eval_crop_fraction: must be in (0, 1]"
  # One without a key of its own is about the key it was met in.
  model = errors.ConfigError.of(errors.InputError("dtype must be a float"),
                                "config.model")
  assert str(model) == "config.model: dtype must be a float"
  source = errors.ConfigError.of(errors.InputError("/w holds no run"),
                                 "config.init_from", "/w")
  assert str(source) == "config.init_from='/w': /w holds no run"
  assert str(errors.ConfigError.of(inner)) == str(inner)
  turned_off = errors.ConfigError.of(
      errors.InputError("split 'x' holds no examples"), "config.evaluators.e",
      hint="or turn it off")
  assert str(turned_off) == ("config.evaluators.e: split 'x' holds no "
                             "examples (or turn it off)")


def test_an_os_error_reads_as_its_path_and_reason():
  missing = FileNotFoundError(errno.ENOENT, "No such file or directory",
                              "/w/config.json")
  assert errors.os_error_message(missing) == (
      "/w/config.json: No such file or directory")
  assert str(errors.ConfigError.of(missing, "config.init_from", "/w")) == (
      "config.init_from='/w': /w/config.json: No such file or directory")
  full = OSError(errno.ENOSPC, "No space left on device")
  assert errors.os_error_message(full) == str(full)
