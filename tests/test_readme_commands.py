"""The README's two commands, as written, install what the course and the tests import.

Checked against behaviour, not sentences: the extras each command installs against the
optional imports of the lessons and of CI's install, and the root user's launch.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _block_after(heading: str) -> str:
    """The first bash block after the paragraph that starts with ``heading``."""
    rest = README[README.index(heading) :]
    return re.search(r"```bash\n(.*?)\n```", rest, re.S).group(1)


def _extras(command: str) -> set[str]:
    m = re.search(r"pip install .*?-e '?\.(?:\[([\w,]+)\])?'?", command)
    assert m, command
    return set((m.group(1) or "").split(",")) - {""}


def _modules(extra: str) -> set[str]:
    """Top-level modules an extra installs (by its requirement names), extras it includes."""
    names = set()
    for req in EXTRAS[extra]:
        name = re.match(r"[\w.-]+", req).group(0)
        inner = re.search(r"specdec-course\[([\w,]+)\]", req)
        if inner:
            for e in inner.group(1).split(","):
                names |= _modules(e)
        else:
            names.add(name.lower().replace("-", "_"))
    return names


def _lesson_imports() -> set[str]:
    found = set()
    for nb in (ROOT / "lessons").glob("*.ipynb"):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                src = "".join(cell["source"])
                found |= set(re.findall(r"^\s*(?:import|from)\s+(\w+)", src, re.M))
    return found


def test_the_open_command_installs_every_extra_a_lesson_imports():
    opened = set().union(*(_modules(e) for e in _extras(_block_after("**Open the course**"))))
    optional = set().union(*(_modules(e) for e in EXTRAS))
    needed = _lesson_imports() & optional
    assert "transformers" in needed  # lesson 10
    assert needed <= opened, f"the open command does not install {sorted(needed - opened)}"


def test_the_test_command_installs_what_ci_installs():
    ci = (ROOT / ".ci" / "run").read_text()
    ci_extras = set().union(*(_extras(line) for line in ci.splitlines() if "pip install" in line
                              and " -e " in line))  # fmt: skip
    assert _extras(_block_after("**Run every test**")) == ci_extras


def test_the_readme_says_how_root_starts_jupyterlab():
    # JupyterLab exits as root without --allow-root; the README gives the flag right after
    # the open command.
    after = README[README.index("**Open the course**") :]
    after = after[: after.index("**Run every test**")]
    assert "--allow-root" in after and "root" in after.replace("--allow-root", "")
