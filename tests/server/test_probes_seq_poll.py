"""Probes of a `poll` repository changed under live sequences and requests
(server/repository.py's poll, main.py's SIGHUP): a poll that finds nothing changed keeps
every live sequence's state; a version added, a version removed and a version policy
changed while clients run are served as Triton's poll serves them (the new version
knows none of the old one's sequences: 400 "must specify the START flag"); a malformed
model dropped beside them fails alone. Every answer is a 200 or a 4xx/503 naming why;
nothing hangs, nothing is a 500. One server child (`--repository-poll-secs` long, so
each poll is the test's SIGHUP) for the file."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from serve_helpers import SAMPLES, ServerProcess, write_model
from test_probes_seq import _acc_body, _acc_config, _infer, _y
from test_sequences import CORRID32_MLIR

from support.iree_tools import HOST_FLAGS, compile_mlir

pytestmark = pytest.mark.timeout(120)

MLP = SAMPLES / "mlp_classifier" / "1" / "model.vmfb"
_MLP = json.loads((SAMPLES / "mlp_classifier" / "config.json").read_text())
_MLP_BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                         "data": [0.5] * 16}]}


@pytest.fixture(scope="module")
def acc_vmfb() -> Path:
    return compile_mlir(CORRID32_MLIR, HOST_FLAGS)


@pytest.fixture(scope="module")
def repository(tmp_path_factory, acc_vmfb) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for name in ("acc", "acc_versions", "acc_still"):
        write_model(root, name, acc_vmfb, _acc_config(4))
    both = {**_acc_config(4), "version_policy": {"all": {}}}
    write_model(root, "acc_both", acc_vmfb, both)
    shutil.copytree(root / "acc_both" / "1", root / "acc_both" / "2")
    write_model(root, "mlp", MLP, _MLP)
    return root


@pytest.fixture(scope="module")
def server(repository):
    proc = ServerProcess("--model-repository", str(repository), "--model-control-mode",
                         "poll", "--repository-poll-secs", "3600")
    try:
        yield proc.start()
    finally:
        proc.stop()


_polls = [0]


def _poll(server: ServerProcess) -> None:
    """A poll now (SIGHUP), returned once the server logged its end."""
    _polls[0] += 1
    server.proc.send_signal(signal.SIGHUP)
    text = server.wait_stderr("SIGHUP: reading the model repository again", timeout=30)
    deadline = time.monotonic() + 30
    while text.count("SIGHUP: reading the model repository again") < _polls[0]:
        assert time.monotonic() < deadline, "no poll"
        time.sleep(0.02)
        text = "".join(server.stderr)
    # the poll's loads end before the index shows them; wait for the index to settle
    time.sleep(0.3)


def _index(server: ServerProcess) -> dict[tuple[str, str | None], dict]:
    status, _, body = server.request("POST", "/v2/repository/index", b"")
    assert status == 200, body
    return {(e["name"], e.get("version")): e for e in json.loads(body)}


def _wait_index(server: ServerProcess, what: str, condition, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        index = _index(server)
        if condition(index):
            return index
        assert time.monotonic() < deadline, f"{what} never happened: {index}"
        time.sleep(0.05)


def test_a_poll_that_finds_nothing_changed_keeps_every_live_sequence(server):
    assert _y(_infer(server, "acc_still", _acc_body(1, 1.0, start=True))[1]) == 1.0
    for k in range(3):
        _poll(server)
        assert _y(_infer(server, "acc_still", _acc_body(1, 1.0))[1]) == 2.0 + k
    assert _y(_infer(server, "acc_still", _acc_body(1, 1.0, end=True))[1]) == 5.0


def test_a_malformed_model_dropped_beside_live_sequences_fails_alone(server, repository):
    """A model whose config.json is malformed appears at a poll: it is UNAVAILABLE with
    its reason, and a sequence living on another model goes on from its state."""
    assert _y(_infer(server, "acc_still", _acc_body(2, 3.0, start=True))[1]) == 3.0
    bad = repository / "bad"
    (bad / "1").mkdir(parents=True)
    shutil.copyfile(MLP, bad / "1" / "model.vmfb")
    (bad / "config.json").write_text('{"max_batch_size": "8", "model_warmup": []}')
    try:
        _poll(server)
        index = _wait_index(server, "bad listed", lambda i: any(k[0] == "bad" for k in i))
        entry = next(e for k, e in index.items() if k[0] == "bad")
        assert entry["state"] == "UNAVAILABLE" and "bad/config.json" in entry["reason"], entry
        assert _y(_infer(server, "acc_still", _acc_body(2, 4.0, end=True))[1]) == 7.0
    finally:
        shutil.rmtree(bad)
    _poll(server)


def test_a_version_added_and_removed_under_a_live_sequence(server, repository, acc_vmfb):
    """Policy latest 1. Version 2 appears while sequence 5 lives on version 1: the poll
    serves version 2, which knows nothing of sequence 5 (its next step: 400 "must
    specify the START flag", as Triton's new version), and sequences started on version
    2 are served; once version 2 is removed again, version 1 serves."""
    model = repository / "acc_versions"
    assert _y(_infer(server, "acc_versions", _acc_body(5, 1.0, start=True))[1]) == 1.0
    shutil.copytree(model / "1", model / "2")
    try:
        _poll(server)
        _wait_index(server, "version 2 serving",
                    lambda i: i.get(("acc_versions", "2"), {}).get("state") == "READY")
        status, payload = _infer(server, "acc_versions", _acc_body(5, 1.0))
        assert status == 400 and "must specify the START flag" in payload, payload
        status, payload = _infer(server, "acc_versions", _acc_body(5, 1.0),
                                 "/v2/models/acc_versions/versions/1/infer")
        assert status in (400, 404, 503), payload
        assert _y(_infer(server, "acc_versions", _acc_body(6, 2.0, start=True))[1]) == 2.0
    finally:
        shutil.rmtree(model / "2")
    _poll(server)
    _wait_index(server, "version 1 serving again",
                lambda i: i.get(("acc_versions", "1"), {}).get("state") == "READY")
    status, payload = _infer(server, "acc_versions", _acc_body(6, 1.0))
    assert status == 400 and "must specify the START flag" in payload, payload
    assert _y(_infer(server, "acc_versions", _acc_body(7, 3.0, start=True, end=True))[1]) \
        == 3.0
    assert "Traceback" not in "".join(server.stderr)


def test_version_policy_changes_under_stateless_load(server, repository):
    """Versions 1 and 2 of mlp, clients asking the model (not a version) throughout while
    the policy goes latest 1 -> all -> specific [1] -> latest 1: every answer is a 200,
    and the index shows the versions each policy selects."""
    model = repository / "mlp"
    shutil.copytree(model / "1", model / "2")
    stop = threading.Event()
    answers: list = []

    def run() -> None:
        while not stop.is_set():
            try:
                answers.append(_infer(server, "mlp", _MLP_BODY))
            except OSError as exc:
                answers.append((None, repr(exc)))

    clients = [threading.Thread(target=run, daemon=True) for _ in range(3)]
    for client in clients:
        client.start()
    try:
        steps = [
            (None, {"2"}),
            ({"all": {}}, {"1", "2"}),
            ({"specific": {"versions": [1]}}, {"1"}),
            ({"latest": {"num_versions": 1}}, {"2"}),
        ]
        for policy, ready in steps:
            config = dict(_MLP) if policy is None else {**_MLP, "version_policy": policy}
            (model / "config.json").write_text(json.dumps(config))
            _poll(server)
            _wait_index(server, f"versions {ready} ready", lambda i, ready=ready: {
                k[1] for k, e in i.items() if k[0] == "mlp" and e.get("state") == "READY"}
                == ready)
    finally:
        stop.set()
        for client in clients:
            client.join(timeout=60)
        shutil.rmtree(model / "2")
        (model / "config.json").write_text(json.dumps(_MLP))
    assert answers and {s for s, _ in answers} == {200}, \
        [a for a in answers if a[0] != 200][:3]


def test_a_changed_version_reloads_alone_and_the_others_sequences_keep_their_state(
        server, repository):
    """Policy all, versions 1 and 2, a sequence on each. Version 2's file changes: the
    poll reloads version 2 alone (its sequence is gone: 400), and the sequence on
    version 1 goes on from its state."""
    one, two = ("/v2/models/acc_both/versions/%d/infer" % v for v in (1, 2))
    assert _y(_infer(server, "", _acc_body(1, 1.0, start=True), one)[1]) == 1.0
    assert _y(_infer(server, "", _acc_body(2, 5.0, start=True), two)[1]) == 5.0
    vmfb = repository / "acc_both" / "2" / "model.vmfb"
    vmfb.write_bytes(vmfb.read_bytes())  # the same bytes, a new file: a change
    reloaded = "".join(server.stderr).count("loaded model acc_both version 2")
    _poll(server)
    _wait_index(server, "version 2 loaded again", lambda i: "".join(server.stderr).count(
        "loaded model acc_both version 2") > reloaded)
    status, payload = _infer(server, "", _acc_body(2, 1.0), two)
    assert status == 400 and "must specify the START flag" in payload, payload
    assert _y(_infer(server, "", _acc_body(1, 2.0, end=True), one)[1]) == 3.0
