"""Stitch's SGLang custom weight loader: in-place weight patches on stock SGLang.

Start SGLang with ``--custom-weight-loader stitch_sglang.apply_patch`` (this
package and ``stitch_patch`` importable by SGLang's scheduler: on its
``PYTHONPATH``) and the Stitch sidecar (``--engine sglang-stock
--patch-commits``) brings the engine from one version to the next by patching
only the values that changed.

SGLang calls a custom loader from ``/update_weights_from_tensor`` when its
``load_format`` names one listed at start, inside a weight-update session
(``/begin_weight_update`` ... ``/end_weight_update``), in the scheduler
between two steps. While generation runs, SGLang first waits for every
request in flight to finish; while generation is paused it goes straight in.
So the sidecar writes the patch file while the engine serves and calls the
loader only inside its pause, where the loader reads the file (from the page
cache: the sidecar has just written it), places and checks it, and applies
it (``stitch_patch``: old values checked, new values written, every patched
tensor hashed against the version's checksums, everything undone on any
failure).

The one "tensor" the sidecar sends is a uint8 tensor named
``stitch_sglang.request`` holding UTF-8 JSON::

    {"patch": "<patch file>", "answer": "<answer file>",
     "verify": "checksums" | "values", "from": "<run>/weight_v...", "to": "..."}

SGLang's own answer only says that the loader returned, so the loader writes
its answer to ``answer`` (written whole, then renamed into place): the
``stitch_patch.apply`` answer (with ``read_seconds``, the time it took to
read, place and check the patch before applying it), or ``{"applied": false, "undone": true,
"error": ...}`` when the patch was refused before any write. The loader
never raises for a patch that does not apply (an exception in a loader ends
SGLang's scheduler, and the whole server with it), with one exception: when
undoing a failed patch fails, the weights are neither version, and the loader
raises so that SGLang stops instead of serving them.

``stitch_sglang.arm_fault`` is a second loader, for tests only: its request
``{"after_tensors": n}`` makes the next patch fail after ``n`` tensors. SGLang
refuses a ``load_format`` it was not started with, so an engine started with
``apply_patch`` alone cannot have a fault armed.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import stitch_patch

REQUEST_NAME = "stitch_sglang.request"

_fault: Dict[str, Optional[int]] = {"after_tensors": None}


def _request(named_tensors: List[Tuple[str, Any]], needs: str) -> Dict[str, Any]:
    """The JSON object the one tensor holds, with the field `needs`."""
    if len(named_tensors) != 1 or named_tensors[0][0] != REQUEST_NAME:
        names = [name for name, _ in named_tensors]
        raise stitch_patch.PatchError(f"expected one tensor named {REQUEST_NAME}, got {names}")
    data = named_tensors[0][1]
    request = json.loads(bytes(data.cpu().tolist()).decode("utf-8"))
    if not isinstance(request, dict) or needs not in request:
        raise stitch_patch.PatchError(f"the request has no {needs!r}")
    return request


def _write_answer(path: str, answer: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(answer, f)
    os.replace(tmp, path)


def _patch(model, request: Dict[str, Any]) -> Dict[str, Any]:
    stitch_patch.check_verify(request.get("verify"))
    stitch_patch.require_unsharded("sglang.srt.distributed")
    start = time.monotonic()
    # Applied at once: apply() checks the old values, once.
    staged = stitch_patch.stage(model, request["patch"], check=False)
    read_seconds = time.monotonic() - start
    if (staged.source, staged.target) != (request.get("from"), request.get("to")):
        raise stitch_patch.PatchError(
            f"the patch file goes from {staged.source} to {staged.target}, the request from "
            f"{request.get('from')} to {request.get('to')}")
    fail_after, _fault["after_tensors"] = _fault["after_tensors"], None
    answer = stitch_patch.apply(staged, request["verify"], fail_after)
    answer["read_seconds"] = read_seconds
    return answer


def apply_patch(model, named_tensors) -> None:
    """SGLang's custom weight loader signature: (model, [(name, tensor)])."""
    try:
        request = _request(named_tensors, "answer")
        if not isinstance(request["answer"], str):
            raise stitch_patch.PatchError("the request's answer is not a path")
    except Exception as e:  # noqa: BLE001: no answer file to write to; SGLang logs this
        print(f"stitch_sglang: not a patch request: {e}", flush=True)
        return
    try:
        answer = _patch(model, request)
    except stitch_patch.RestoreFailed:
        raise
    except Exception as e:  # noqa: BLE001: refused before any write
        answer = {"applied": False, "undone": True, "error": f"{type(e).__name__}: {e}"}
    try:
        _write_answer(request["answer"], answer)
    except OSError as e:  # the sidecar finds no answer: to it, the weights are not known
        print(f"stitch_sglang: cannot write the answer {request['answer']}: {e}", flush=True)


def arm_fault(model, named_tensors) -> None:  # noqa: ARG001: SGLang's loader signature
    """Tests only: the next patch fails after {"after_tensors": n} tensors."""
    _fault["after_tensors"] = int(_request(named_tensors, "after_tensors")["after_tensors"])
