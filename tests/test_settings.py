"""The config's keys (vit_jax/runs/settings.py): one default, bound
and description each, the ConfigDict that configs start from, the typed
Settings a run reads, and what a restart may change."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from configs import base, digits
from tests.util import small_config
from vit_jax import errors, models, weights
from vit_jax.runs import settings, store
from vit_jax.runs.workdir import Workdir
from vit_jax.training import resolve
from vit_jax.weights import pretrained


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

  assert settings.described(Section()) == {"described": "a key",
                                           "bare": None}


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
    ("mixup.prob", 1.5, "config.mixup.prob must be a number in [0.0, 1.0], "
                        "got 1.5"),
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


def test_a_key_a_config_file_adds_is_named():
  """A config file may add keys (its ConfigDict is not locked yet); one
  that is no key would otherwise go unread."""
  config = digits.get_config()
  assert settings.of(config).model.hidden_size == 64
  config.model.hidden_sise = 32
  with pytest.raises(errors.ConfigError, match=r"^config.model has no key "
                     r"'hidden_sise' \(its keys: vit_jax/runs/settings.py\)"):
    settings.of(config)
  config = digits.get_config()
  config.learning_rate = 0.1
  with pytest.raises(errors.ConfigError,
                     match="^the config has no key 'learning_rate'"):
    settings.of(config)


@pytest.mark.parametrize("key, value", [
    ("rope_shift", 0.1), ("rope_jitter", 1.5), ("rope_rescale", 2.0),
    ("rope_theta", 10.0)])
def test_a_rope_key_needs_a_model_with_rope(tmp_path, key, value):
  """model.rope_shift and the other keys that only RoPE reads, set on a
  model without it, were recorded and trained without: refused, naming the
  key, before a workdir is written. The rope of an init_from that has it
  counts (read first); one at the default passes."""
  def config_of(**changes):
    config = digits.get_config()
    config.update_from_flattened_dict({"data_dir": str(tmp_path), **changes})
    return config

  says = (rf"^config.model.{key}={value!r} applies to rotary position "
          r"embeddings, which the model does not have \(config.model.rope=''"
          r".*leave {key} unset$")
  with pytest.raises(errors.ConfigError, match=says.format(key=key)):
    resolve.check_values(settings.of(config_of(**{f"model.{key}": value})))
  resolve.check_values(settings.of(config_of(**{f"model.{key}": value,
                                                "model.rope": "axial",
                                                "model.posemb": "none"})))
  if key == "rope_theta":  # The model's default, set: as unset.
    resolve.check_values(settings.of(config_of(**{"model.rope_theta": 100.0})))
  # init_from: a source without RoPE, then one with it ("mixed": its
  # blocks' learned frequencies), which the run takes (unset here).
  for rope in ("", "mixed"):
    model = models.create("Ti/2", 10, hidden_size=16, num_layers=1,
                          mlp_dim=32, num_heads=2, rope=rope)
    source = str(tmp_path / f"rope_{rope or 'none'}.npz")
    weights.save_npz(model.init(jax.random.key(0), np.zeros((1, 8, 8, 3)),
                                train=False)["params"], source)
    config = config_of(**{f"model.{key}": value, "init_from": source})
    keys = settings.of(config)
    resolve.check_values(keys)  # Its rope is init_from's: not read yet.
    workdir = tmp_path / f"run_{rope or 'none'}"
    if rope:
      assert pretrained.with_source(keys).model.rope == "mixed"
      resolve.check_rope(pretrained.with_source(keys))
      continue
    with pytest.raises(errors.ConfigError, match=says.format(key=key)):
      resolve.run(config, str(workdir))
    assert not workdir.exists()


def resolved_digits(**changes):
  """The digits config's Settings as a run records them: the model's
  function and architecture options filled in as resolve fills them for
  no init_from; `changes` as dotted keys."""
  config = digits.get_config()
  config.model.update(models.SOURCE_OPTIONS)
  config.input_shares = 4
  config.update_from_flattened_dict(changes)
  return settings.of(config)


def test_a_restart_changes_only_what_the_keys_allow(tmp_path):
  recorded = resolved_digits()
  allowed = resolved_digits(**{
      "total_steps": 2000, "mesh.data": 4, "evaluators.test.every": 7,
      "model.remat_policy": "nothing_saveable"})
  assert set(store.differences_allowed(allowed, recorded,
                                       Workdir(tmp_path))) == {
      "total_steps", "mesh.data", "evaluators.test.every",
      "model.remat_policy"}
  for change in ({"model.posemb": "sincos2d"}, {"optimizer.b1": 0.8},
                 {"mixup.prob": 0.5}, {"seed": 1}):
    with pytest.raises(errors.ConfigError, match=next(iter(change))):
      store.differences_allowed(resolved_digits(**change), recorded,
                                Workdir(tmp_path))


def test_settings_read_back_from_config_json_as_they_were_written(tmp_path):
  keys = resolved_digits(**{"model.resnet_stages": (3, 4, 9),
                            "optimizer.lr_mults": (("head", 10.0),)})
  Workdir(tmp_path).write_config(keys)
  assert Workdir(tmp_path).read_config() == keys


# config.json files of earlier versions: digits.json and finetune.json as
# vit_jax 39e603b wrote them for these configs; first_runs.json is
# digits.json less every key added since runs were first recorded (where
# it held what the key's `before` says), as the first runs wrote it.
RECORDED = os.path.join(os.path.dirname(__file__), "recorded_configs")
FINETUNE = {"init_from": "gap.npz", "image_size": 16,
            "mesh.data": 2, "mesh.fsdp": 2, "model.scan_layers": True,
            "optimizer.lr_mults": (("head", 10.0),), "randaugment": "2,10",
            "evaluators.test.every": 2}


@pytest.mark.parametrize("name, overrides, input_shares", [
    ("digits", {}, 16), ("finetune", FINETUNE, 16),
    # One share per data-parallel device (data 4 x fsdp 1), as such runs
    # read their data.
    ("first_runs", {}, 4)])
def test_a_run_recorded_by_an_earlier_version_resumes_unchanged(
    name, overrides, input_shares, digits_data_dir, tmp_path):
  with open(os.path.join(RECORDED, f"{name}.json")) as f:
    recorded = json.load(f)
  # The paths of this session: its digits, and the fine-tune's source (a
  # "gap" model's release .npz, as the run was started from).
  recorded["data_dir"] = digits_data_dir
  if "init_from" in overrides:
    overrides = {**overrides, "init_from": str(tmp_path / "gap.npz")}
    recorded["init_from"] = overrides["init_from"]
    model = models.create("Ti/2", 10, hidden_size=32, num_layers=2,
                          mlp_dim=64, num_heads=4, classifier="gap")
    weights.save_npz(model.init(jax.random.key(0), np.zeros((1, 8, 8, 3)),
                                train=False)["params"], recorded["init_from"])
  (tmp_path / "config.json").write_text(json.dumps(recorded))
  read = Workdir(tmp_path).read_config()
  run = resolve.run(small_config(digits_data_dir, **overrides), str(tmp_path))
  assert run.changes == {}
  assert run.settings.input_shares == input_shares
  assert run.settings == dataclasses.replace(read, input_shares=input_shares)
  # What a new run of the same config records today, but for what the run
  # recorded in its own time (the shares it read its data in).
  new = resolve.run(small_config(digits_data_dir, **overrides),
                    str(tmp_path / "new"))
  assert new.settings == dataclasses.replace(
      read, input_shares=new.settings.input_shares)
