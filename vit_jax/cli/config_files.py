"""Why an ml_collections config file named on the command line
(`--config=PATH[:ARG]`) did not load, as `--NAME=ARGUMENT: why`."""

import os

from absl import flags
from ml_collections.config_flags import config_flags as ml_config_flags

from vit_jax import errors


def check_loaded():
  """An InputError for a config flag, parsed already, whose file did not
  load."""
  for name in _config_file_flags():
    flag = flags.FLAGS[name]
    error = _load_error(flag.value)
    if error is not None:
      raise errors.InputError(_message(
          name, ml_config_flags.get_config_filename(flag), error))


def failure(argv):
  """Why a config file named on the command line `argv` does not load, or
  None.

  Parsing stops at the first error, which may come from the failed config
  (an override of a config that did not load) or hide it: each file is
  loaded again here, so that its own error is the one reported.
  """
  for name in _config_file_flags():
    for argument in _flag_arguments(argv, name):
      try:
        error = _load_error(flags.FLAGS[name].parser.parse(argument))
      except (TypeError, ValueError) as e:
        # ml_collections re-raises these with the config's traceback as
        # the message (for absl, which keeps only the message); the
        # config's own error is what it re-raised.
        error = e.__context__ or e
      except Exception as e:  # pylint: disable=broad-except
        error = e  # The config's own, as raised (a SyntaxError, ...).
      if error is not None:
        return _message(name, argument, error)
  return None


def _config_file_flags():
  """The names of the flags that take an ml_collections config file."""
  return [name for name in flags.FLAGS if isinstance(
      flags.FLAGS[name].parser, ml_config_flags.ConfigFileFlagParser)]


def _load_error(config):
  """The error of a config file that did not load, or None.

  For a file that is missing or raises an OSError, ml_collections' parser
  returns, in place of the config, a stand-in whose every attribute access
  raises an OSError caused by the load's error; a config that loaded lets
  this lookup of a name it lacks fall back to the default.
  """
  try:
    getattr(config, "_vit_jax_no_such_field", None)
  except OSError as e:
    return e.__cause__ or e
  return None


def _flag_arguments(argv, name):
  """The values given to flag `name` in argv (`--name=V` or `--name V`)."""
  values = []
  for i, arg in enumerate(argv[1:], 1):
    flag, equals, value = arg.lstrip("-").partition("=")
    if arg.startswith("-") and flag == name:
      if equals:
        values.append(value)
      elif i + 1 < len(argv):
        values.append(argv[i + 1])
  return values


def _message(name, argument, error):
  """`--NAME=ARGUMENT: why` for a config file that does not load."""
  path = argument.split(":", 1)[0]
  if not os.path.exists(path):
    return f"--{name}={path}: no such file"
  if isinstance(error, OSError) and error.strerror:
    # The file's own (a directory) or one of a file that the config reads,
    # which is then named.
    reason = (error.strerror if error.filename in (None, path)
              else errors.os_error_message(error))
  else:
    reason = str(error) or type(error).__name__
  return f"--{name}={argument}: {reason}"
