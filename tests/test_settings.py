"""The config's keys (vit_jax/training/settings.py): one default, bound
and description each, the ConfigDict that configs start from, and the
typed Settings a run reads."""

import dataclasses

import pytest

from configs import base, digits
from vit_jax import errors
from vit_jax.training import settings


def test_every_key_has_one_line_of_description():
  described = settings.described()
  assert "optimizer.learning_rate" in described and "model.name" in described
  missing = [key for key, text in described.items()
             if not text or "\n" in text or len(text) > 120]
  assert not missing, missing


def test_a_key_without_a_description_is_found():
  @dataclasses.dataclass(frozen=True)
  class Section:
    described: int = settings.key(0, "a key")
    bare: int = 0

  assert dict(settings._described(Section(), "")) == {  # pylint: disable=protected-access
      "described": "a key", "bare": None}


def test_the_config_files_start_from_the_defaults():
  config = base.get_config()
  assert config.to_dict() == dataclasses.asdict(settings.Settings())
  # Unset keys are placeholders of their type: an override is type-checked.
  assert config.input_shares is None and config.model.classifier is None
  with pytest.raises(TypeError):
    config.model.num_registers = "four"


def test_settings_are_the_configs_values_typed_and_frozen():
  config = digits.get_config()
  config.optimizer.learning_rate = 0.5
  config.mixup.prob = 0.25
  config.evaluators.test.every = 7
  checked = settings.of(config)
  assert checked.dataset == "digits" and checked.image_size == 8
  assert checked.optimizer.learning_rate == 0.5
  assert (checked.mixup.prob, checked.mixup.alpha) == (0.25, 0.2)
  assert checked.evaluators["test"]["every"] == 7
  assert checked.mesh == settings.Mesh(data=-1, fsdp=1, model=1)
  with pytest.raises(dataclasses.FrozenInstanceError):
    checked.total_steps = 1


@pytest.mark.parametrize("key, value, message", [
    ("batch_size", 0, "config.batch_size must be a whole number >= 1, "
                      "got 0"),
    ("optimizer.warmup_steps", -1, "config.optimizer.warmup_steps must be "
                                   "a whole number >= 0, got -1"),
    ("optimizer.b2", 1.0, "config.optimizer.b2 must be a number in "
                          "[0.0, 1.0), got 1.0"),
    ("polyak_decay", -0.5, "config.polyak_decay must be a number in "
                           "[0.0, 1.0), got -0.5"),
    ("model.dropout_rate", float("nan"), "config.model.dropout_rate must be "
                                         "a number in [0.0, 1.0), got nan"),
])
def test_a_value_out_of_bounds_is_named(key, value, message):
  config = digits.get_config()
  config.update_from_flattened_dict({key: value})
  with pytest.raises(errors.ConfigError) as error:
    settings.of(config)
  assert str(error.value) == message
