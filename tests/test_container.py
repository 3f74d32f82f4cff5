"""The container image, built and started for real (opt-in: `python -m pytest -m container`).

No image registry is reachable from the machines this runs on, so the base image is made
from Debian's packages (`debootstrap`, then `podman import`) and handed to the Dockerfile
as its `BASE_IMAGE`; the image is built with `podman build --isolation chroot`. Where
`podman run` is refused (namespaces, rlimits), the image's entrypoint is started in its
mounted root filesystem (`podman image mount` + `chroot`, as the image's user), on a free
port, and asked for an inference with tritonclient, then stopped with SIGTERM, which must
drain to exit 0. The commands are the ones deploy/README.md gives.

Needs root, `podman`, `debootstrap` and `chroot`; skipped with the reason otherwise. The
base image is kept between runs (`localhost/tinyhal-test-base:bookworm`); the first run
downloads a few hundred MB of Debian packages and wheels and takes minutes.

The Kubernetes manifests (deploy/kubernetes/tinyhal-serve.yaml and haproxy.yaml) run as
written with `podman kube play` (also needs `runc`: podman 4.3's default crun fails on
such hosts): two replicas, the HAProxy front end published on 127.0.0.1:8000, the admin
key read from the Secret's file; sequences answer through the front end, a replica
stopped drains to exit 0 and new sequences go to the other one.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = "localhost/tinyhal-test-base:bookworm"
IMAGE = "localhost/tinyhal-serve:test"

pytestmark = [pytest.mark.container, pytest.mark.timeout(3000)]


def _log(step: str, proc: subprocess.CompletedProcess) -> None:
    """The step and the tail of what it printed, in the test's output (pytest -s)."""
    out = (proc.stdout or "") + (proc.stderr or "")
    print(f"--- {step}: exit {proc.returncode}\n" + "\n".join(out.splitlines()[-40:]))


def _run(step: str, argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    _log(step, proc)
    assert proc.returncode == 0, f"{step} failed"
    return proc


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("building and mounting images with podman here needs root")
    found = {name: shutil.which(name) for name in ("podman", "debootstrap", "chroot")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (Debian: apt-get install podman "
                    "debootstrap)")
    return found  # type: ignore[return-value]


@pytest.fixture(scope="module")
def base_image(tools) -> str:
    podman = tools["podman"]
    if subprocess.run([podman, "image", "exists", BASE], timeout=60).returncode == 0:
        return BASE
    with tempfile.TemporaryDirectory(prefix="tinyhal-base-") as folder:
        rootfs = Path(folder) / "rootfs"
        _run("debootstrap", [tools["debootstrap"], "--variant=minbase",
                             "--include=python3,python3-venv", "bookworm", str(rootfs),
                             "http://deb.debian.org/debian"], timeout=1500)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            _run("podman import", [podman, "import", "-", BASE], timeout=600, stdin=tar.stdout)
        finally:
            tar.stdout.close()
            tar.wait(timeout=600)
    return BASE


@pytest.fixture(scope="module")
def image(tools, base_image) -> str:
    # the CA bundle pip is told to trust here (a TLS-inspecting proxy's) reaches the build
    # as a secret, never as a layer
    bundle = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    secret = ["--secret", f"id=pip-ca,src={bundle}"] if os.path.exists(bundle) else []
    _run("podman build", [tools["podman"], "build", "--isolation", "chroot", "--format",
                          "docker", *secret, "--build-arg", f"BASE_IMAGE={base_image}",
                          "--ignorefile", str(ROOT / "deploy" / "Dockerfile.dockerignore"),
                          "-f", str(ROOT / "deploy" / "Dockerfile"), "-t", IMAGE, str(ROOT)],
         timeout=2400)
    return IMAGE


@pytest.fixture
def mounted(tools, image) -> Path:
    proc = _run("podman image mount", [tools["podman"], "image", "mount", image], timeout=120)
    try:
        yield Path(proc.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([tools["podman"], "image", "unmount", image], timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_built_image_serves_an_inference(tools, mounted):
    import tritonclient.http as httpclient

    port = _free_port()
    env = {"PATH": "/opt/tinyhal/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp",
           "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    server = subprocess.Popen(
        [tools["chroot"], "--userspec=10001:10001", str(mounted),
         "/opt/tinyhal/bin/tinyhal-serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for line in server.stdout:
            lines.append(line)
            if "tinyhal-serve: ready" in line:
                ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not ready.wait(0.5):
            assert server.poll() is None and time.monotonic() < deadline, "".join(lines)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
        try:
            inputs = []
            for name, value in (("alpha", [2.0]), ("x", [1.0, 2.0, 3.0]),
                                ("y", [1.0, 1.0, 1.0])):
                tensor = httpclient.InferInput(name, [len(value)], "FP32")
                tensor.set_data_from_numpy(np.array(value, np.float32))
                inputs.append(tensor)
            result = client.infer("saxpy", inputs)
            output = result.as_numpy(result.get_response()["outputs"][0]["name"])
            print(f"--- inference on the image's server: saxpy(2, [1 2 3], [1 1 1]) = {output}")
            assert output.tolist() == [3.0, 5.0, 7.0]
        finally:
            client.close()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
        reader.join(10)
        print("--- the image's tinyhal-serve said:\n" + "".join(lines[-20:]))


# -- the Kubernetes manifests under `podman kube play` ---------------------------------

KUBE = ROOT / "deploy" / "kubernetes"
# podman 4.3's set-up on such hosts (deploy/README.md): runc, and limits it may set
PODMAN_CONF = """[containers]
default_ulimits = ["nofile=16384:16384", "nproc=8192:8192"]
[engine]
runtime = "runc"
"""


@pytest.fixture(scope="module")
def kube_images(tools, base_image, image) -> None:
    """The image names the manifests use: the tinyhal-serve image and the front end's."""
    podman = tools["podman"]
    _run("podman tag", [podman, "tag", image, "localhost/tinyhal-serve:0.1.0"], timeout=60)
    _run("podman build haproxy", [podman, "build", "--isolation", "chroot", "--format",
                                  "docker", "--build-arg", f"BASE_IMAGE={base_image}",
                                  "--ignorefile", str(ROOT / "deploy" / "Dockerfile.dockerignore"),
                                  "-f", str(ROOT / "deploy" / "haproxy" / "Dockerfile"),
                                  "-t", "localhost/tinyhal-haproxy:2.6", str(ROOT)],
         timeout=1200)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_kubernetes_manifests_run_under_podman_kube_play(tools, kube_images, tmp_path):
    import urllib.error
    import urllib.request

    import tritonclient.http as httpclient

    if shutil.which("runc") is None:
        pytest.skip("runc not installed (Debian: apt-get install runc)")
    if not _port_free(8000):
        pytest.skip("127.0.0.1:8000, where the front end is published, is in use")
    podman = tools["podman"]
    conf = tmp_path / "containers.conf"
    conf.write_text(PODMAN_CONF)
    env = dict(os.environ, CONTAINERS_CONF=str(conf))
    network = f"tinyhal-kube-{uuid.uuid4().hex[:8]}"
    # podman 4.3 writes a secret volume's file base64-encoded: a key that is base64 text
    # itself, given as `data`, comes out as written
    key = base64.b64encode(os.urandom(24)).decode()
    secret = tmp_path / "secret.yaml"
    secret.write_text("apiVersion: v1\nkind: Secret\nmetadata:\n  name: tinyhal-serve-admin\n"
                      f"type: Opaque\ndata:\n  admin-key: {key}\n")

    def podman_run(step: str, *args: str, timeout: float = 300) -> None:
        _run(step, [podman, *args], timeout=timeout, env=env)

    manifests = [KUBE / "tinyhal-serve.yaml", KUBE / "haproxy.yaml"]
    podman_run("network create", "network", "create", network)
    try:
        subprocess.run([podman, "secret", "rm", "tinyhal-serve-admin"], env=env,
                       capture_output=True, timeout=60)
        podman_run("secret create", "secret", "create", "tinyhal-serve-admin", str(secret))
        for manifest in manifests:
            podman_run(f"kube play {manifest.name}", "kube", "play", "--network", network,
                       str(manifest))
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:8000/v2/health/ready",
                                            timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the front end never answered ready"
            time.sleep(1)
        for headers, want in (({}, 403), ({"x-tinyhal-admin-key": key}, 200)):
            try:
                req = urllib.request.Request("http://127.0.0.1:8000/v2/models/stats",
                                             headers=headers)
                with urllib.request.urlopen(req, timeout=10) as resp:
                    status = resp.status
            except urllib.error.HTTPError as err:
                status = err.code
            assert status == want, headers

        def sequences(first: int) -> list[str]:
            errors: list[str] = []
            rng = np.random.default_rng(first)

            def run(sid: int) -> None:
                client = httpclient.InferenceServerClient("127.0.0.1:8000",
                                                          network_timeout=60)
                try:
                    for k in range(5):
                        x = httpclient.InferInput("INPUT", [1, 8], "FP32")
                        x.set_data_from_numpy(rng.standard_normal((1, 8)).astype(np.float32))
                        client.infer("gru_step", [x], sequence_id=sid,
                                     sequence_start=k == 0, sequence_end=k == 4)
                except Exception as exc:  # noqa: BLE001 - collected and asserted
                    errors.append(str(exc))
                finally:
                    client.close()

            threads = [threading.Thread(target=run, args=(first + i,)) for i in range(10)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            return errors

        assert sequences(100) == []
        podman_run("pod stop", "pod", "stop", "-t", "45", "tinyhal-serve-pod-1", timeout=120)
        code = subprocess.run([podman, "inspect", "tinyhal-serve-pod-1-tinyhal-serve",
                               "--format", "{{.State.ExitCode}}"], env=env,
                              capture_output=True, text=True, timeout=60).stdout.strip()
        assert code == "0"
        time.sleep(3)  # the front end's checks see it gone
        assert sequences(200) == []
    finally:
        for manifest in reversed(manifests):
            subprocess.run([podman, "kube", "play", "--down", str(manifest)], env=env,
                           capture_output=True, timeout=300)
        subprocess.run([podman, "secret", "rm", "tinyhal-serve-admin"], env=env,
                       capture_output=True, timeout=60)
        subprocess.run([podman, "network", "rm", network], env=env, capture_output=True,
                       timeout=60)
