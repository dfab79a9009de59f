"""The README's marked commands run as written.

A code block preceded by `<!-- test -->` runs line by line; one preceded by
`<!-- test: ARGS -->` runs with ARGS appended to each command, to shorten
it (a later flag wins). Shell scripts, and the first training and the
first prediction, run as typed, in a shell; the other `python -m
vit_jax.X` commands run in the test's own process, from the same words. Blocks run in the README's order, in one scratch
directory that links the checkout's configs/, launch/ and docs/, with this
interpreter's bin/ (the venv's) first on PATH: later blocks use what
earlier ones made, as a reader's commands do.

Two blocks are run by other tests instead, to keep the suite short:
`vit_jax.plan` of the digits config on v3-8 (tests/test_plan.py, with
--json) and the local pod (tests/test_pod.py).
"""

import os
import re
import shlex
import subprocess
import sys

from tests.util import REPO, call_tool

MARKER = re.compile(r"<!-- test(?:: (.*?))? -->")
LINKED = ("configs", "launch", "docs")


def marked_blocks(text):
  """[(commands, appended args)] of the marked code blocks, in order."""
  blocks, lines = [], text.splitlines()
  for i, line in enumerate(lines):
    marker = MARKER.fullmatch(line.strip())
    if not marker:
      continue
    assert lines[i + 1].startswith("```"), f"README line {i + 2}: no block"
    end = lines.index("```", i + 2)
    source = "\n".join(lines[i + 2:end]).replace("\\\n", " ")
    commands = [" ".join(c.split()) for c in source.splitlines()
                if c.strip() and not c.lstrip().startswith("#")]
    blocks.append((commands, marker.group(1) or ""))
  return blocks


def readme():
  with open(os.path.join(REPO, "README.md")) as f:
    return f.read()


def test_the_markers_are_found():
  blocks = marked_blocks(readme())
  commands = [c for block, _ in blocks for c in block]
  assert any(c.startswith("python -m vit_jax.main --config=configs/digits.py")
             for c in commands)
  for tool in ("export", "figures", "predict"):
    assert any(c.startswith(f"python -m vit_jax.{tool} ") for c in commands)


def test_the_readme_commands_run_as_written(tmp_path):
  for name in LINKED:
    os.symlink(os.path.join(REPO, name), tmp_path / name)
  # The venv's bin/ names this interpreter `python` and `python3`.
  bin_dir = os.path.dirname(sys.executable)
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  typed = {"main", "predict"}  # Each tool's first command, as typed.
  for commands, appended in marked_blocks(readme()):
    for command in commands:
      words = shlex.split(f"{command} {appended}")
      tool = (words[2].removeprefix("vit_jax.")
              if words[:2] == ["python", "-m"] else None)
      if tool is not None and tool not in typed:
        # In this process, from the same words (tests/util.py, call_tool).
        status, _, stderr = call_tool(tool, *words[3:], cwd=tmp_path)
        assert status == 0, (command, stderr[-3000:])
        continue
      typed.discard(tool)
      done = subprocess.run(["bash", "-c", f"{command} {appended}"],
                            cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
      assert done.returncode == 0, (command, done.stderr[-3000:])


def section(text, title):
  """The README's text from `title` (a heading) to the next heading."""
  start = text.index(title)
  return text[start:text.index("\n#", start + len(title))]


def test_the_config_table_names_every_key_and_only_keys():
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.runs import settings  # pylint: disable=g-import-not-at-top
  keys = settings.described()
  table = section(readme(), "### Config keys")
  rows = {line.split("|")[1]: line for line in table.splitlines()
          if line.startswith("| `")}
  named = {key for first in rows for key in re.findall(r"`(\w+)`", first)}
  assert named == {key for key in keys if "." not in key}
  # A section's keys are named in its row; the model's, under Models.
  for name in ("optimizer", "mixup", "cutmix", "mesh", "naflex", "distill"):
    (row,) = [line for first, line in rows.items() if f"`{name}`" in first]
    assert not [key for key in keys if key.startswith(f"{name}.") and
                f"`{key.split('.')[1]}`" not in row], name
  described = section(readme(), "### Models")
  assert not [key for key in (*keys, *models.CONFIG_FIELDS)
              if key.startswith("model.") and
              f"`{key.split('.')[1]}`" not in described]
  assert not [key for key in models.CONFIG_FIELDS
              if f"`{key}`" not in described]


def test_the_keys_a_restart_may_change_are_the_ones_the_readme_lists():
  from vit_jax.runs import settings  # pylint: disable=g-import-not-at-top
  text = readme()
  start = text.index("- A changed config is refused")
  bullet = text[start:text.index("\n- ", start + 1)]
  named = set(re.findall(r"`([\w.]+)`", bullet)) - {"config_changes.jsonl"}
  assert named == {key.removesuffix(".*")
                   for key in settings.changeable_keys()}
