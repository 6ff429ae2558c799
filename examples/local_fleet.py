"""A Stitch fleet on this machine, for examples and tests: a filesystem
store, N replicas (an engine and its `stitch sidecar` each) and a
`stitch gateway` over a `file:` pool, every process on 127.0.0.1 in its own
process group with its log in the fleet's directory.

Engines are Stitch's reference engine (`stitch engine`, SGLang's API) or real
vLLM servers (`engine="vllm"`, started with `vllm_python` through
scripts/vllm_serve.py with Stitch's worker extension, their sidecars
committing DELTAs as in-place patches).

    fleet = LocalFleet("/tmp/f", stitch_bin, replicas=2)
    fleet.start(base_checkpoint, run_id="run-1")   # the store claimed at v0
    ... fleet.gateway, fleet.pool_spec, fleet.kill(0) ...
    fleet.close()
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0):
    """(status, parsed body); (0, None) when nothing answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, body
    except (urllib.error.URLError, ConnectionError, OSError, ValueError):
        return 0, None


def wait_until(condition, timeout: float, what: str, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class Process:
    """A command in its own process group, its output in a log file."""

    def __init__(self, cmd: Sequence[str], log_path: str, env: Optional[dict] = None) -> None:
        self.cmd, self.log_path = list(cmd), log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env={**os.environ, **(env or {})})

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self.alive():
            self.kill_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group(signal.SIGKILL)  # whatever is left of the group
        self.proc.wait()
        self.log.close()

    def tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""


class Replica:
    """An engine (at engine_url) and its sidecar (at url)."""

    def __init__(self, name: str, engine: Process, sidecar: Process, url: str,
                 engine_url: str) -> None:
        self.name, self.engine, self.sidecar = name, engine, sidecar
        self.url, self.engine_url = url, engine_url

    def info(self) -> dict:
        status, body = get_json(self.url + "/server_info")
        return body if status == 200 and isinstance(body, dict) else {}

    def wait_serving(self, version: int, timeout: float = 60.0) -> None:
        """Until the replica is in rotation on `version`."""
        def serving():
            info = self.info()
            return bool(info.get("ready")) and info.get("applied_version") == version
        wait_until(serving, timeout, f"{self.name} to serve v{version}")

    def close(self) -> None:
        self.sidecar.close()
        self.engine.close()


class LocalFleet:
    """`replicas` replicas behind a gateway, on one store."""

    def __init__(self, directory: str, stitch_bin: str, replicas: int = 2,
                 engine: str = "reference", vllm_python: Optional[str] = None,
                 engine_start_timeout: float = 600.0) -> None:
        if engine not in ("reference", "vllm"):
            raise ValueError(f"engine must be reference or vllm, not {engine!r}")
        if engine == "vllm" and not vllm_python:
            raise ValueError("engine='vllm' needs vllm_python, the python of vLLM's environment")
        self.dir, self.stitch, self.count = directory, stitch_bin, replicas
        self.engine, self.vllm_python = engine, vllm_python
        self.engine_start_timeout = engine_start_timeout
        self.store = os.path.join(directory, "store")
        self.pool_file = os.path.join(directory, "pool.txt")
        self.pool_spec = f"file:{self.pool_file}"
        self.replicas: List[Replica] = []
        self.gateway_process: Optional[Process] = None
        self.gateway = ""
        os.makedirs(directory, exist_ok=True)

    def _run(self, *args: str) -> None:
        r = subprocess.run([self.stitch, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        if r.returncode != 0:
            raise RuntimeError(f"stitch {' '.join(args)} exited {r.returncode}: {r.stderr}")

    def start(self, base: str, run_id: str) -> "LocalFleet":
        """Claims the store for `run_id` at version 0 (the weights of
        `base`), starts every replica and the gateway, and returns once all
        replicas are in rotation."""
        self.base, self.run_id = base, run_id
        self._run("claim", "--store", self.store, "--run-id", run_id, "--boot-version", "0")
        try:
            for i in range(self.count):
                self.replicas.append(self._start_replica(f"r{i}"))
            self._write_pool()
            port = free_port()
            self.gateway = f"http://127.0.0.1:{port}"
            self.gateway_process = Process(
                [self.stitch, "gateway", "--pool", self.pool_spec, "--host", "127.0.0.1",
                 "--port", str(port), "--poll-interval", "0.1", "--admission-wait", "30"],
                os.path.join(self.dir, "gateway.log"))
            timeout = self.engine_start_timeout + 60
            for r in self.replicas:
                wait_until(lambda r=r: self._ready(r), timeout, f"replica {r.name} to be ready")
            wait_until(lambda: len(self.in_rotation()) == self.count, 60,
                       "the gateway to see every replica")
        except BaseException:
            self.close()
            raise
        return self

    def _ready(self, replica: Replica) -> bool:
        if not replica.sidecar.alive() or not replica.engine.alive():
            which = replica.sidecar if not replica.sidecar.alive() else replica.engine
            raise RuntimeError(f"{replica.name}: {os.path.basename(which.log_path)} exited:\n"
                               f"{which.tail()}")
        return bool(replica.info().get("ready"))

    def _start_replica(self, name: str) -> Replica:
        work = os.path.join(self.dir, name)
        os.makedirs(work, exist_ok=True)
        engine_port, sidecar_port = free_port(), free_port()
        engine_url = f"http://127.0.0.1:{engine_port}"
        sidecar = ["sidecar", "--store", self.store, "--run-id", self.run_id,
                   "--engine-url", engine_url, "--base-checkpoint", self.base,
                   "--local-checkpoint", os.path.join(work, "local"),
                   "--reconcile-interval", "0.5", "--watchdog-interval", "0.5",
                   "--host", "127.0.0.1", "--port", str(sidecar_port)]
        if self.engine == "reference":
            engine = Process([self.stitch, "engine", "--model", self.base, "--host", "127.0.0.1",
                              "--port", str(engine_port), "--run-id", self.run_id,
                              "--worker-threads", "1"], os.path.join(work, "engine.log"))
            sidecar += ["--engine", "sglang", "--update-mode", "cpu"]
        else:
            engine = Process(
                [self.vllm_python, os.path.join(REPO, "scripts", "vllm_serve.py"), "serve",
                 self.base, "--host", "127.0.0.1", "--port", str(engine_port),
                 "--served-model-name", "policy", "--dtype", "bfloat16", "--max-model-len", "256",
                 "--enforce-eager", "--max-num-seqs", "8", "--enable-prefix-caching",
                 "--worker-extension-cls", "stitch_vllm.WeightPatchExtension"],
                os.path.join(work, "engine.log"),
                env={"PYTHONPATH": os.path.join(REPO, "python", "src")})
            sidecar += ["--engine", "vllm", "--update-mode", "disk", "--patch-commits",
                        "--engine-start-timeout", str(self.engine_start_timeout)]
        sidecar_process = Process([self.stitch, *sidecar], os.path.join(work, "sidecar.log"))
        return Replica(name, engine, sidecar_process, f"http://127.0.0.1:{sidecar_port}",
                       engine_url)

    def _write_pool(self) -> None:
        tmp = self.pool_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join(r.url + "\n" for r in self.replicas))
        os.replace(tmp, self.pool_file)

    def gateway_replicas(self) -> list:
        status, body = get_json(self.gateway + "/replicas")
        if status != 200:
            return []
        return body if isinstance(body, list) else body.get("replicas", [])

    def in_rotation(self) -> list:
        return [r for r in self.gateway_replicas() if r.get("ready")]

    def kill(self, index: int) -> Replica:
        """SIGKILL to a replica's engine and sidecar (their process groups)."""
        replica = self.replicas[index]
        for process in (replica.sidecar, replica.engine):
            process.kill_group()
            process.proc.wait()
        return replica

    def close(self) -> None:
        if self.gateway_process is not None:
            self.gateway_process.close()
        for r in self.replicas:
            r.close()
