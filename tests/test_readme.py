"""The documentation's snippets run as written: README.md, docs/*.md and deploy/README.md.

In each document, in order, in one fresh directory: every ```python block, and every
```sh block whose first line is a comment starting with "# make" (it makes files later
blocks use) or "# run" (a command whose output the document describes). Other ```sh
blocks (installing, serving on a fixed port, benchmarks) and unmarked blocks are for
reading. Commands are run as from the repository root: its `tests/` folder is linked into
the fresh directory (the model builders live there), so nothing is written into the
checkout. A client snippet addressed to `HOST:PORT` is pointed at a real tinyhal-serve.
The model-repository keys the README lists are the ones the server knows.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]

pytestmark = pytest.mark.timeout(600)


def _blocks(path: Path) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", path.read_text(), re.M | re.S)


def _runs(lang: str, code: str) -> bool:
    return lang == "python" or lang == "sh" and code.startswith(("# make", "# run"))


def _run_document(path: Path, folder: Path, monkeypatch,
                  substitutions: dict[str, str] | None = None) -> list[str]:
    """Runs the document's runnable blocks in `folder`; the python blocks' outputs."""
    (folder / "tests").symlink_to(ROOT / "tests")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    monkeypatch.chdir(folder)
    outputs = []
    for lang, code in _blocks(path):
        if not _runs(lang, code):
            continue
        for placeholder, value in (substitutions or {}).items():
            code = code.replace(placeholder, value)
        if lang == "sh":
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=folder,
                                  env=env, capture_output=True, text=True, timeout=400)
            assert proc.returncode == 0, code + proc.stdout + proc.stderr
        else:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, str(path), "exec"), {"__name__": "__doc_snippet__"})
            outputs.append(out.getvalue())
    return outputs


def test_readme_snippets_run_as_written(tmp_path, monkeypatch):
    blocks = _blocks(README)
    python = [code for lang, code in blocks if lang == "python"]
    makes = [code for lang, code in blocks if lang == "sh" and code.startswith("# make")]
    assert len(python) >= 2 and any("iree-compile" in code for code in makes)
    outputs = _run_document(README, tmp_path, monkeypatch)
    # the outputs the README shows in its comments
    assert "[[3. 0. 7. 0.]]" in outputs[0]
    assert "[1. 2. 3. 4.]\n16" in outputs[1]
    assert "[0. 2. 4. 6.]" in outputs[3]
    from tinyhal.server.repository import ModelRepository

    repo = ModelRepository(tmp_path / "models")
    try:
        assert repo.load_all() == []
        assert repo.get("scaler").batching is not None
    finally:
        repo.close()


def test_emu_guide_snippets_run_as_written(tmp_path, monkeypatch):
    path = ROOT / "docs" / "emu.md"
    assert sum(_runs(lang, code) for lang, code in _blocks(path)) >= 3
    (summary,) = _run_document(path, tmp_path, monkeypatch)
    assert "edge-npu" in summary or "modelled" in summary.lower(), summary
    assert (tmp_path / "mobilenet_v2.vmfb").exists() and (tmp_path / "x.npy").exists()


def test_deploy_guide_snippets_run_against_a_real_server(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "tests" / "server"))
    try:
        from serve_helpers import ServerProcess
    finally:
        sys.path.remove(str(ROOT / "tests" / "server"))
    server = ServerProcess().start()
    try:
        (output,) = _run_document(ROOT / "deploy" / "README.md", tmp_path, monkeypatch,
                                  {"HOST:PORT": server.url})
    finally:
        server.stop()
    assert output.strip(), "the client snippet printed nothing"


def test_every_document_with_code_is_covered():
    """A document gaining a runnable block must gain a test above."""
    covered = {README, ROOT / "docs" / "emu.md", ROOT / "deploy" / "README.md"}
    for path in DOCUMENTS:
        if any(_runs(lang, code) for lang, code in _blocks(path)):
            assert path in covered, path


def test_readme_documents_every_config_key():
    """The config keys the README lists are exactly the ones the server accepts."""
    from tinyhal.server.repository import CONFIG_KEYS

    text = README.read_text()
    documented = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", text, re.M))
    keys = {k for pair in documented for k in pair if k}
    assert keys == set(CONFIG_KEYS)
    assert "--model-repository" in text


def _command_lines(path: Path) -> list[str]:
    """The tinyhal command lines, `python bench/...` runs and `pip install '.[extra]'`
    installs a document shows, in code blocks and inline code, placeholders and all."""
    text = path.read_text()
    found = []
    for _, code in _blocks(path):
        for line in code.replace("\\\n", " ").splitlines():
            found += re.findall(r"(?:^|&& |\$ |/)((?:tinyhal-(?:run|check|serve)(?= -|$)|"
                                r"python3? bench/|pip install )[^#&|>]*)", line.strip())
    outside = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    found += [span for span in re.findall(r"`([^`\n]+)`", outside)
              if re.match(r"(tinyhal-(run|check|serve) -|python3? bench/|pip install )", span)]
    return [line.strip() for line in found if " [-" not in line]  # not usage synopses


def test_every_documented_command_line_is_one_the_tools_take(capsys):
    """Commands the documents show but do not run (a server on a fixed port, benchmarks,
    installs) still name only flags their tool takes, bench scripts that exist with the
    flags they parse, and extras the package declares."""
    from tinyhal.server.main import _parser as serve_parser
    from tinyhal.vm.check import run as check_run
    from tinyhal.vm.run import _parser as run_parser

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    checked = 0
    for path in DOCUMENTS:
        for line in _command_lines(path):
            words = shlex.split(line)
            where = f"{path.name}: {line}"
            if words[0].startswith("tinyhal-") and "--help" in words:
                words.remove("--help")  # what it prints is checked in test_first_contact
            if words[0] == "tinyhal-run":
                flags = [w for w in words[1:] if not w.startswith("--flagfile=")]
                run_parser().parse_args(flags)
            elif words[0] == "tinyhal-serve":
                serve_parser().parse_args(words[1:])
            elif words[0] == "tinyhal-check":
                assert check_run([*words[1:], "--help"], stdout=io.StringIO()) == 0, where
                capsys.readouterr()
            elif words[0].startswith("python"):
                script = ROOT / words[1]
                assert script.is_file(), where
                source = script.read_text()
                for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
                    assert f'"{flag}"' in source, f"{where}: {flag} is not a flag of it"
            else:  # pip install: the checkout (`.`, whatever its folder is called), an
                # extra it declares, or a named distribution that is not tinyhal
                for word in words[2:]:
                    if word.startswith("."):
                        assert re.fullmatch(r"\.(\[[\w,-]+\])?", word), where
                        for extra in re.findall(r"[\w-]+", word):
                            assert extra in extras, where
                    else:
                        assert word.startswith("-") or not word.startswith("tinyhal"), where
            checked += 1
    assert checked >= 20
