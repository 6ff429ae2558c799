"""Runs a local S3 protocol server (moto) for Stitch's S3 tests.

Started by the tests (tests/s3_moto_server.cc, tests/multihost/) with the
project's virtual environment's Python. It:
  1. starts `moto_server` on a free port of --host (default 127.0.0.1) (moto cannot bind port 0:
     a port is picked by binding and releasing one, and another is tried if
     the server cannot take it), in this process's process group;
  2. waits until the server answers (polling, with a deadline);
  3. creates an IAM user with an access key, and temporary credentials of an
     assumed role, both allowed everything, and a bucket;
  4. turns on moto's request authentication, so that every later request
     must carry a valid SigV4 signature;
  5. prints one JSON line with the endpoint, bucket and credentials;
  6. waits for its standard input to close (the test finished or died),
     then stops the server and exits.

`stitch chaos` runs it as an S3 server it can kill and restart:
  --port N        serve on port N (fixed: a restarted server keeps its address)
  --state FILE    keep the server's data across restarts: moto's recorder
                  appends every request to FILE, and a new server replays the
                  writes recorded there (PUT, POST, DELETE; a line cut short by
                  a kill is dropped) before it listens (the server then runs in
                  this process)
  --no-auth       no IAM user and no signature checks: any credentials pass
  --until-signal  serve until SIGTERM or SIGINT instead of until stdin closes
It then prints "s3_moto: serving on http://127.0.0.1:N" before the JSON line.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BUCKET = "stitch-test"
REGION = "us-east-1"
START_ATTEMPTS = 5
READY_DEADLINE_S = 60.0


def fail(message):
    print(f"s3_moto: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def answers(endpoint):
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def start_server(moto_server, log, host):
    """Returns (process, endpoint) of a server that answers."""
    for _ in range(START_ATTEMPTS):
        port = free_port(host)
        endpoint = f"http://{host}:{port}"
        proc = subprocess.Popen(
            [moto_server, "-H", host, "-p", str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + READY_DEADLINE_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break  # most likely the port was taken meanwhile: try another
            if answers(endpoint):
                return proc, endpoint
            time.sleep(0.05)  # polling interval, bounded by the deadline
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log.seek(0)
    fail("moto_server did not start; its output:\n" + log.read().decode(errors="replace")[-4000:])


def setup(endpoint):
    import boto3  # from the project's virtual environment

    common = dict(endpoint_url=endpoint, region_name=REGION,
                  aws_access_key_id="testing", aws_secret_access_key="testing")
    iam = boto3.client("iam", **common)
    sts = boto3.client("sts", **common)
    s3 = boto3.client("s3", **common)
    allow_all = json.dumps({"Version": "2012-10-17",
                            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})
    iam.create_user(UserName="stitch")
    iam.put_user_policy(UserName="stitch", PolicyName="all", PolicyDocument=allow_all)
    key = iam.create_access_key(UserName="stitch")["AccessKey"]
    trust = json.dumps({"Version": "2012-10-17",
                        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
                                       "Action": "sts:AssumeRole"}]})
    role = iam.create_role(RoleName="stitch-role", AssumeRolePolicyDocument=trust)["Role"]
    iam.put_role_policy(RoleName="stitch-role", PolicyName="all", PolicyDocument=allow_all)
    session = sts.assume_role(RoleArn=role["Arn"], RoleSessionName="stitch-test")["Credentials"]
    s3.create_bucket(Bucket=BUCKET)
    # From here on every request must be signed by a known key.
    req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                 headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(req, timeout=10) as r:
        if r.status != 200:
            fail(f"enabling authentication answered {r.status}")
    return {
        "endpoint": endpoint,
        "region": REGION,
        "bucket": BUCKET,
        "access_key_id": key["AccessKeyId"],
        "secret_access_key": key["SecretAccessKey"],
        "session_access_key_id": session["AccessKeyId"],
        "session_secret_access_key": session["SecretAccessKey"],
        "session_token": session["SessionToken"],
    }


def compact_state(path):
    """Keeps the writes of a recording, dropping reads and a cut-short line."""
    kept = []
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("method") in ("PUT", "POST", "DELETE"):
                    kept.append(json.dumps(entry))
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in kept))
    os.replace(path + ".tmp", path)
    return len(kept)


def serve_with_state(args):
    """The --state server, in this process: the recorded writes are replayed
    into the application before it listens, so that no client ever sees the
    data partly restored."""
    state = os.path.abspath(args.state)
    replayed = compact_state(state)
    os.environ["MOTO_RECORDER_FILEPATH"] = state
    os.environ["MOTO_PORT"] = str(args.port)
    import base64
    from urllib.parse import urlsplit

    from moto.moto_api import recorder
    from moto.moto_server.werkzeug_app import (DomainDispatcherApplication,
                                               MotoRequestHandler, create_backend_app)
    from werkzeug.serving import make_server
    from werkzeug.test import Client

    app = DomainDispatcherApplication(create_backend_app)
    client = Client(app)
    base_url = f"http://127.0.0.1:{args.port}"
    with open(state, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            body = entry.get("body") or b""
            if entry.get("body_encoded"):
                body = base64.b64decode(body)
            headers = {k: v for k, v in entry.get("headers", {}).items()
                       if k.lower() not in ("content-length", "transfer-encoding")}
            url = urlsplit(entry["url"])
            path = url.path + (f"?{url.query}" if url.query else "")
            client.open(path, method=entry["method"], headers=headers, data=body,
                        base_url=base_url)
    recorder.start_recording()
    server = make_server("127.0.0.1", args.port, app, threaded=True,
                         request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if not replayed:
        import boto3  # from the project's virtual environment
        boto3.client("s3", endpoint_url=base_url, region_name=REGION,
                     aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
    return server, base_url, replayed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int)
    parser.add_argument("--state")
    parser.add_argument("--no-auth", action="store_true")
    parser.add_argument("--until-signal", action="store_true")
    args = parser.parse_args()
    moto_server = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.access(moto_server, os.X_OK):
        fail(f"{moto_server} is missing; run scripts/install-deps")
    proc = None

    def stop(*_):
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    if args.state or args.no_auth or args.until_signal or args.port:
        if not (args.state and args.no_auth and args.until_signal and args.port):
            fail("--port, --state, --no-auth and --until-signal go together")
        signal.signal(signal.SIGINT, stop)
        _, endpoint, replayed = serve_with_state(args)
        print(f"s3_moto: serving on {endpoint} (bucket {BUCKET}, {replayed} writes replayed)",
              flush=True)
        print(json.dumps({"endpoint": endpoint, "region": REGION, "bucket": BUCKET}), flush=True)
        while True:
            signal.pause()
    with tempfile.TemporaryFile() as log:
        proc, endpoint = start_server(moto_server, log, args.host)
        try:
            info = setup(endpoint)
        except Exception as e:  # report any setup failure as one line
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            stop_message = f"setting up moto failed: {type(e).__name__}: {e}\n{tail}"
            proc.kill()
            proc.wait()
            fail(stop_message)
        print(json.dumps(info), flush=True)
        sys.stdin.read()  # returns at EOF: the test is done
        stop()


if __name__ == "__main__":
    main()
