"""The original Python Stitch's sidecar launcher, ``python -m stitch.sidecar``
and ``SidecarConfig``, over ``stitch sidecar``: the flag list taken from the
original's source (tests/data/original_sidecar_flags.txt) is true of the
module and of docs/migrating.md, and a launcher and a trainer written for the
original run unchanged against the reference engine."""

import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

import stitch.sidecar
from conftest import REPO
from stitch.sidecar import ORIGINAL_STORE_FACTORY, SidecarConfig, sidecar_argv

HERE = os.path.dirname(os.path.abspath(__file__))
FLAG_LIST = os.path.join(REPO, "tests", "data", "original_sidecar_flags.txt")
RUN = "run-orig"


def flag_list():
    flags, fields, store_opts = [], [], []
    with open(FLAG_LIST) as f:
        for line in f:
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "flag":
                flags.append((words[1], words[2] if len(words) > 2 else None))
            elif words[0] == "field":
                fields.append(words[1])
            elif words[0] == "store-opt":
                store_opts.append(words[1])
    return flags, fields, store_opts


def original_argv(tmp_path):
    argv = []
    for flag, value in flag_list()[0]:
        argv.append(flag)
        if value is not None:
            argv.append({"BULLETIN": str(tmp_path / "bulletin"), "BASE": str(tmp_path / "base"),
                         "LOCAL": str(tmp_path / "local")}.get(value, value))
    return argv


def test_the_module_takes_every_flag_and_field_of_the_original(tmp_path):
    flags, fields, _ = flag_list()
    assert len(flags) == 18 and len(fields) == 18
    config = SidecarConfig.from_argv(original_argv(tmp_path))
    assert config.store_factory == ORIGINAL_STORE_FACTORY
    assert config.store_options == {"backend": "local"}
    assert config.debug_requests and config.flush_cache_on_commit
    assert config.watchdog_failure_threshold == 3
    ours = {f.name for f in dataclasses.fields(SidecarConfig)}
    assert set(fields) <= ours, set(fields) - ours
    assert SidecarConfig.from_argv(config.to_argv()) == config
    # What `stitch sidecar` is given: its own flags, the store wiring as is.
    argv = sidecar_argv(config)
    assert argv[:2] == ["stitch", "sidecar"]
    for ours_flag in ("--engine-url", "--base-checkpoint", "--local-checkpoint", "--update-mode",
                      "--watchdog-threshold", "--store-factory", "--store-opt", "--bulletin-root",
                      "--debug-requests", "--flush-cache-on-commit"):
        assert ours_flag in argv


def test_migrating_md_says_what_each_flag_field_and_store_option_is_here():
    flags, fields, store_opts = flag_list()
    with open(os.path.join(REPO, "docs", "migrating.md")) as f:
        page = f.read()
    section = page[page.index("## Sidecar flags"):]
    for flag, _ in flags:
        assert f"`{flag}" in section, flag
    for name in fields + store_opts:
        assert f"`{name}`" in section or f"`{name}=" in section, name
    assert "`python -m stitch.sidecar`" in section


def test_sidecar_config_checks_what_the_original_checks():
    base = dict(bulletin_root="/b", base_checkpoint_dir="/m", delta_update_mode="cpu",
                store_factory=ORIGINAL_STORE_FACTORY, run_id=RUN)
    assert SidecarConfig(**base).port == 8000
    with pytest.raises(TypeError, match="run_id"):
        SidecarConfig(**{k: v for k, v in base.items() if k != "run_id"})
    with pytest.raises(ValueError, match="local_checkpoint_dir"):
        SidecarConfig(**{**base, "delta_update_mode": "disk"})
    with pytest.raises(ValueError, match="store_factory"):
        SidecarConfig(**{**base, "store_factory": "no-colon"})
    with pytest.raises(ValueError, match="local_root"):
        SidecarConfig(**{**base, "store_options": {"local_root": "/x"}})
    with pytest.raises(ValueError, match="boot_version"):
        SidecarConfig(**{**base, "boot_version": -1})


def test_a_store_factory_of_the_originals_shape_is_called_for_its_store_uri(tmp_path):
    sys.path.insert(0, HERE)
    config = SidecarConfig(bulletin_root=str(tmp_path / "store"), base_checkpoint_dir="/m",
                           delta_update_mode="cpu", store_factory="original_stores:create_store",
                           store_options={"backend": "fs"}, run_id=RUN)
    argv = sidecar_argv(config)
    assert argv[argv.index("--store") + 1].endswith(str(tmp_path / "store"))
    with pytest.raises(ValueError, match="unsupported store backend"):
        sidecar_argv(dataclasses.replace(config, store_options={"backend": "volume"}))


def test_without_a_stitch_binary_the_module_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("STITCH_BIN", str(tmp_path / "no-such-stitch"))
    with pytest.raises(FileNotFoundError, match="make build"):
        stitch.sidecar.find_stitch_binary()
    monkeypatch.delenv("STITCH_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(stitch.sidecar.sysconfig, "get_path", lambda name: str(tmp_path))
    monkeypatch.setattr(stitch.sidecar.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(FileNotFoundError, match="STITCH_BIN=.*cmake.define.STITCH_BINARY"):
        stitch.sidecar.find_stitch_binary()


def stitch_binary():
    try:
        return stitch.sidecar.find_stitch_binary()
    except FileNotFoundError as error:
        pytest.skip(str(error))


def get_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_for(what, probe, proc, timeout=120):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what}: the process exited ({proc.returncode})")
        try:
            last = probe()
            if last:
                return last
        except OSError as error:
            last = error
        time.sleep(0.1)
    pytest.fail(f"{what}: not within {timeout} s (last: {last})")


def read_url(proc, marker):
    line = proc.stdout.readline()
    assert marker in line, line
    return line.split(marker, 1)[1].split()[0]


def test_a_launcher_and_a_trainer_written_for_the_original_run_unchanged(tmp_path):
    binary = stitch_binary()
    model = tmp_path / "model"
    made = subprocess.run([binary, "engine", "init-model", str(model), "--dtype", "float32"],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    engine = subprocess.Popen([binary, "engine", "--model", str(model), "--port", "0", "--run-id",
                               RUN, "--boot-version", "0"], stdout=subprocess.PIPE,
                              stderr=open(tmp_path / "engine.log", "w"), text=True,
                              start_new_session=True)
    sidecar = None
    store = tmp_path / "store"
    env = {**os.environ, "STITCH_BIN": binary,
           "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    try:
        engine_url = read_url(engine, ") on ")
        # The run is claimed before the fleet starts (a sidecar refuses a
        # store never claimed); the trainer claims it again at launch.
        from stitch.publish import claim_run
        from stitch.stores import FsStore
        claim_run(FsStore(str(store), run_id=RUN), None, RUN)

        sys.path.insert(0, HERE)
        from original_launcher import start_sidecar
        sidecar = start_sidecar(
            sidecar_port=0, upstream=engine_url, bulletin_root=str(store),
            base_checkpoint_dir=str(model), local_checkpoint_dir=str(tmp_path / "local"),
            delta_update_mode="disk", store_factory="original_stores:create_store",
            store_options={"backend": "fs"}, run_id=RUN, debug_requests=True, env=env,
            stderr=open(tmp_path / "sidecar.log", "w"))
        sidecar_url = read_url(sidecar, "listening on ")
        info = wait_for("the sidecar's first /server_info",
                        lambda: get_json(f"{sidecar_url}/server_info"), sidecar)
        assert info["run_id"] == RUN

        trainer = subprocess.run(
            [sys.executable, os.path.join(HERE, "original_sidecar_trainer.py"), str(store),
             str(tmp_path / "trainer"), str(model), sidecar_url],
            capture_output=True, text=True, env=env, timeout=300)
        assert trainer.returncode == 0, trainer.stdout + trainer.stderr
        seen = json.loads(trainer.stdout.strip().splitlines()[-1])
        assert seen == {"published": f"{RUN}/weight_v000001", "pointer": f"{RUN}/weight_v000001"}

        served = wait_for("the sidecar serving version 1",
                          lambda: (lambda i: i if i.get("applied_version") == 1 and i["ready"]
                                   else None)(get_json(f"{sidecar_url}/server_info")), sidecar)
        assert served["applied"] == f"{RUN}/weight_v000001"
    finally:
        for proc in (sidecar, engine):
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in (sidecar, engine):
            if proc is not None:
                proc.communicate(timeout=30)
    sidecar_err = (tmp_path / "sidecar.log").read_text()
    assert sidecar.returncode == 0, sidecar_err
    # --debug-requests: each request the sidecar received is logged.
    assert "request: GET /server_info" in sidecar_err
    assert "request: POST /wake" in sidecar_err
