"""The README's snippets run as written: every ```python block, in order, in one fresh
directory, after the ```sh blocks that make the files they use (those whose first line
starts with "# make"). The model-repository keys it lists are the ones the server knows."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

pytestmark = pytest.mark.timeout(300)


def _blocks() -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), re.M | re.S)


def test_readme_snippets_run_as_written(tmp_path, monkeypatch):
    blocks = _blocks()
    python = [code for lang, code in blocks if lang == "python"]
    makes = [code for lang, code in blocks if lang == "sh" and code.startswith("# make")]
    assert len(python) >= 2 and any("iree-compile" in code for code in makes)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    monkeypatch.chdir(tmp_path)
    outputs = []
    for lang, code in blocks:
        if lang == "sh" and code.startswith("# make"):
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=240)
            assert proc.returncode == 0, code + proc.stdout + proc.stderr
        elif lang == "python":
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
            outputs.append(out.getvalue())
    # the outputs the README shows in its comments
    assert "[[3. 0. 7. 0.]]" in outputs[0]
    assert "[0. 2. 4. 6.]" in outputs[2]
    from tinyhal.server.repository import ModelRepository

    repo = ModelRepository(tmp_path / "models")
    try:
        assert repo.load_all() == []
        assert repo.get("scaler").batching is not None
    finally:
        repo.close()


def test_readme_documents_every_config_key():
    """The config keys the README lists are exactly the ones the server accepts."""
    from tinyhal.server.repository import CONFIG_KEYS

    text = README.read_text()
    documented = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", text, re.M))
    keys = {k for pair in documented for k in pair if k}
    assert keys == set(CONFIG_KEYS)
    assert "--model-repository" in text
