import json
import os
import shutil
import subprocess
import sys

import pytest

# The repository's pure-Python reference codec (tests/delta_reference.py).
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests"))


@pytest.fixture(scope="module")
def s3():
    """A local S3 protocol server (moto, SigV4 enforced) for the module's
    tests: its endpoint, region, bucket and credentials."""
    if shutil.which("moto_server", path=os.path.dirname(sys.executable)) is None:
        pytest.fail("moto_server is not installed: run scripts/install-deps")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "s3_moto.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            pytest.fail("tests/s3_moto.py exited before printing its endpoint")
        yield json.loads(line)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
