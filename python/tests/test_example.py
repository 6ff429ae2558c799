"""examples/train_loop.py: its torch-free parts (the task, the requests, the
weights it rebuilds from a store); the PyTorch step itself needs torch."""

import http.server
import importlib.util
import json
import os
import py_compile
import threading

import numpy as np

import stitch
from conftest import REPO

EXAMPLE = os.path.join(REPO, "examples", "train_loop.py")
RUN = "run-1"


def load_example():
    spec = importlib.util.spec_from_file_location("train_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports without torch
    return module


def test_the_example_compiles_and_imports_without_torch():
    py_compile.compile(EXAMPLE, doraise=True)
    tl = load_example()
    assert tl.encode_text("ab") == [256, 97, 98]
    assert tl.byte_set_reward([97, 65, 257, 98], b"ab") == 0.5
    assert tl.byte_set_reward([], b"a") == 0.0
    adv = tl.group_advantages([1.0, 0.0, 0.5, 0.5], 2)
    assert adv[0] > 0 > adv[1] and adv[2] == adv[3] == 0.0


def test_the_example_rebuilds_the_pointers_weights_from_the_store(tmp_path):
    tl = load_example()
    boot = {"w": np.arange(8, dtype=np.float32)}
    enc = stitch.DeltaEncoder(boot, version=0, run_id=RUN)
    enc.write_anchor(str(tmp_path / "model"))
    store = stitch.open_store(str(tmp_path / "store"), RUN)
    stitch.claim_run(store, RUN, 0)
    assert tl.current_weights(store, str(tmp_path / "model"), str(tmp_path)) == (0, str(tmp_path / "model"))
    for v in (1, 2):
        out = enc.encode({"w": boot["w"] + v}, str(tmp_path / "out" / f"weight_v{v:06d}"))
        stitch.publish_version(store, out["dir"], RUN)
    version, directory = tl.current_weights(store, str(tmp_path / "model"), str(tmp_path / "work"))
    assert version == 2
    np.testing.assert_array_equal(tl.read_checkpoint(directory)["w"], boot["w"] + 2)


def test_the_example_asks_the_gateway_for_latest_minus_lag(tmp_path):
    tl = load_example()
    seen = {}

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen["session"] = self.headers.get("X-Session-Id")
            body = json.dumps({"text": "a", "meta_info": {"weight_version": "4",
                                                          "output_token_logprobs": [[-0.5, 97, None]]}})
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tl.generate(f"http://127.0.0.1:{server.server_address[1]}", [256, 65], latest=5, lag=1,
                          session="g1", max_new_tokens=3, seed=7)
    finally:
        server.shutdown()
        server.server_close()
    assert out == {"completion": [97], "logprobs": [-0.5], "version": 4}
    assert seen["body"]["weight_version"] == {"min_version": 4}
    assert seen["session"] == "g1"
