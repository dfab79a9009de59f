"""The marked commands of the README and of docs/ run as written.

A code block preceded by `<!-- test -->` runs line by line; one preceded by
`<!-- test: ARGS -->` runs with ARGS appended to each command, to shorten
it (a later flag wins). Shell scripts, and the first training and the
first prediction, run as typed, in a shell; the other `python -m
vit_jax.X` commands run in the test's own process, from the same words.
The README's blocks run first, then each docs page's, in the order
docs/index.md lists the pages, all in one scratch directory that links
the checkout's configs/, launch/ and docs/, with this interpreter's bin/
(the venv's) first on PATH: later blocks use what earlier ones made
(workdir/digits, digits.npz), as a reader's commands do; a command that
ran already, word for word, is not run again. The first training's
output has the shape the README's Quickstart shows.

The commands of docs/plan.md and docs/pods.md are not marked: a plan
compiles for a TPU slice (tests/test_plan.py plans from the command line,
with --json), and the local pod trains in several processes
(tests/test_pod.py). Every relative link of these pages leads to a file,
and to a heading where it names one.
"""

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.util import REPO, call_tool

MARKER = re.compile(r"<!-- test(?:: (.*?))? -->")
LINKED = ("configs", "launch", "docs")
README_LINES = 300


def read(path):
  with open(os.path.join(REPO, path)) as f:
    return f.read()


def docs_pages():
  """docs/*.md in the order docs/index.md links them."""
  pages = []
  for target in re.findall(r"\]\(([\w.-]+\.md)\)", read("docs/index.md")):
    if target not in pages:
      pages.append(target)
  return [f"docs/{page}" for page in pages]


def pages():
  """The README, then the docs pages: the order their blocks run in."""
  return ["README.md", *docs_pages()]


def marked_blocks(text, name="README.md"):
  """[(commands, appended args)] of the marked code blocks, in order."""
  blocks, lines = [], text.splitlines()
  for i, line in enumerate(lines):
    marker = MARKER.fullmatch(line.strip())
    if not marker:
      continue
    assert lines[i + 1].startswith("```"), f"{name} line {i + 2}: no block"
    end = lines.index("```", i + 2)
    source = "\n".join(lines[i + 2:end]).replace("\\\n", " ")
    commands = [" ".join(c.split()) for c in source.splitlines()
                if c.strip() and not c.lstrip().startswith("#")]
    blocks.append((commands, marker.group(1) or ""))
  return blocks


def all_blocks():
  return [(page, block) for page in pages()
          for block in marked_blocks(read(page), page)]


def test_every_docs_page_is_listed_in_the_index_and_the_readme_links_it():
  listed = docs_pages()
  on_disk = sorted(os.path.relpath(p, REPO) for p in
                   glob.glob(os.path.join(REPO, "docs", "*.md")))
  assert sorted(set(listed) - {"docs/index.md"}) == sorted(
      set(on_disk) - {"docs/index.md"})
  assert "](docs/index.md)" in read("README.md")


def test_the_readme_is_a_front_door():
  """A few hundred lines; no figure of one machine or one day."""
  text = read("README.md")
  assert len(text.splitlines()) <= README_LINES
  assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)
  assert not re.search(r"\d[\d,.]* img/s", text)


def test_the_markers_are_found():
  commands = [c for _, (block, _) in all_blocks() for c in block]
  readme = [c for block, _ in marked_blocks(read("README.md"))
            for c in block]
  # The first training and the first prediction run as typed: the README's.
  assert readme[0].startswith(
      "python -m vit_jax.main --config=configs/digits.py")
  assert any(c.startswith("python -m vit_jax.predict ") for c in readme)
  for tool in ("export", "figures", "predict"):
    assert any(c.startswith(f"python -m vit_jax.{tool} ") for c in commands)


def expected_output():
  """The README's Quickstart output, each line (but `...`) as a regex:
  capitals stand for numbers."""
  text = read("README.md")
  start = text.index("```\nstep ")
  lines = text[start + 4:text.index("```", start + 4)].splitlines()
  shapes = []
  for line in lines:
    if line == "...":
      continue
    shape = re.escape(line)
    for written, pattern in (
        (r"step(\\ )+\d+/\d+", r"step +\\d+/\\d+"),
        (r"\\\(train.*\\\)", r"\\(.*\\)"),  # The buckets, largest first.
        (r"/abs/path/", r"/\\S*"),
        (r"\bMmSs\b", r"(\\d+h)?(\\d+m)?\\d+s"),
        (r"\b[LNAD]\b", r"[\\d.,]+")):
      shape = re.sub(written, pattern, shape)
    shapes.append(re.compile(shape))
  return shapes


def assert_shaped_as_the_readme_says(stdout):
  lines = iter(stdout.splitlines())
  for shape in expected_output():
    assert any(shape.fullmatch(line) for line in lines), (shape.pattern,
                                                           stdout)


def test_the_expected_output_is_a_shape():
  printed = """\
Training Ti/2 on digits for 1000 steps: batch 128
step    1/1000 | loss 2.3026 | first step (compiles) 9s
step   50/1000 | loss 1.9738 | 937 img/s | ETA 2m10s
step 1000/1000 | test_accuracy 0.9806 | test_examples 360
test_accuracy 0.9806 | test_examples 360 | core_days 0.003250 (compile 24s (17%), train 102s (73%)) | TensorBoard: tensorboard --logdir /tmp/x/workdir/digits
"""
  assert len(expected_output()) == 3
  assert_shaped_as_the_readme_says(printed)


# The first `vit_jax.main` and `vit_jax.predict` commands, as typed: a
# process each.
@pytest.mark.processes(2)
def test_the_marked_commands_run_as_written(tmp_path):
  for name in LINKED:
    os.symlink(os.path.join(REPO, name), tmp_path / name)
  # The venv's bin/ names this interpreter `python` and `python3`.
  bin_dir = os.path.dirname(sys.executable)
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  typed = {"main", "predict"}  # Each tool's first command, as typed.
  done_before = set()  # A page may repeat a command (docs/mae.md the README's).
  for page, (commands, appended) in all_blocks():
    for command in commands:
      if f"{command} {appended}" in done_before:
        continue
      done_before.add(f"{command} {appended}")
      words = shlex.split(f"{command} {appended}")
      tool = (words[2].removeprefix("vit_jax.")
              if words[:2] == ["python", "-m"] else None)
      if tool is not None and tool not in typed:
        # In this process, from the same words (tests/util.py, call_tool).
        status, _, stderr = call_tool(tool, *words[3:], cwd=tmp_path)
        assert status == 0, (page, command, stderr[-3000:])
        continue
      done = subprocess.run(["bash", "-c", f"{command} {appended}"],
                            cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
      assert done.returncode == 0, (page, command, done.stderr[-3000:])
      if tool == "main" and tool in typed:
        assert_shaped_as_the_readme_says(done.stdout)
      typed.discard(tool)


def section(text, title):
  """The text under the heading `title` (a whole line, such as "##
  Models"), up to the next heading."""
  start = re.search(rf"^{re.escape(title)}$", text, re.MULTILINE).end()
  following = re.search(r"^#", text[start:], re.MULTILINE)
  return text[start:start + following.start() if following else None]


def test_the_config_table_names_every_key_and_only_keys():
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.runs import settings  # pylint: disable=g-import-not-at-top
  keys = settings.described()
  reference = read("docs/config.md")
  table = section(reference, "## Config keys")
  rows = {line.split("|")[1]: line for line in table.splitlines()
          if line.startswith("| `")}
  named = {key for first in rows for key in re.findall(r"`(\w+)`", first)}
  assert named == {key for key in keys if "." not in key}
  # A section's keys are named in its row; the model's, under Models.
  for name in ("optimizer", "mixup", "cutmix", "mesh", "naflex", "distill"):
    (row,) = [line for first, line in rows.items() if f"`{name}`" in first]
    assert not [key for key in keys if key.startswith(f"{name}.") and
                f"`{key.split('.')[1]}`" not in row], name
  described = section(reference, "## Models")
  assert not [key for key in (*keys, *models.CONFIG_FIELDS)
              if key.startswith("model.") and
              f"`{key.split('.')[1]}`" not in described]
  assert not [key for key in models.CONFIG_FIELDS
              if f"`{key}`" not in described]


def test_the_models_page_describes_every_option_a_checkpoint_fixes():
  """docs/models.md has a bullet for each option declared of kind
  architecture (but posemb, which has a section of its own) and of kind
  function, where its declaration adds one."""
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  text = read("docs/models.md")

  def bulleted(title):  # The names before each bullet's colon.
    heads = re.findall(r"^- (.*?):", section(text, title), re.MULTILINE)
    return {name for head in heads for name in re.findall(r"`(\w+)", head)}

  assert set(models.ARCHITECTURE_OPTIONS) - {"posemb"} == bulleted(
      "## Today's options")
  assert set(models.FUNCTION_OPTIONS) == bulleted(
      "## The function of other sources' weights")
  assert "posemb" in section(text, "## Position embeddings")


def test_the_keys_a_restart_may_change_are_the_ones_the_docs_list():
  from vit_jax.runs import settings  # pylint: disable=g-import-not-at-top
  text = read("docs/training.md")
  start = text.index("- A changed config is refused")
  bullet = text[start:text.index("\n- ", start + 1)]
  named = set(re.findall(r"`([\w.]+)`", bullet)) - {"config_changes.jsonl"}
  assert named == {key.removesuffix(".*")
                   for key in settings.changeable_keys()}


FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(text):
  """The anchors GitHub gives a page's headings."""
  found, seen = set(), {}
  for heading in re.findall(r"^#+ (.*)$", FENCED.sub("", text),
                            re.MULTILINE):
    slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    found.add(f"{slug}-{count}" if count else slug)
  return found


def test_every_relative_link_leads_to_a_file_and_heading():
  broken = []
  for page in ["README.md", *sorted(
      os.path.relpath(p, REPO)
      for p in glob.glob(os.path.join(REPO, "docs", "*.md")))]:
    text = re.sub(r"`[^`\n]*`", "", FENCED.sub("", read(page)))
    for target in LINK.findall(text):
      if re.match(r"[a-z]+:", target):  # https:, mailto:
        continue
      path, _, anchor = target.partition("#")
      resolved = (os.path.normpath(os.path.join(os.path.dirname(page), path))
                  if path else page)
      if not os.path.exists(os.path.join(REPO, resolved)):
        broken.append(f"{page}: {target}")
      elif anchor and resolved.endswith(".md") and (
          anchor not in anchors(read(resolved))):
        broken.append(f"{page}: {target} (no such heading)")
  assert not broken, broken
