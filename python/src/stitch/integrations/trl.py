"""Stitch for TRL's ``GRPOTrainer``: rollouts from a versioned fleet, a
version published after every optimizer step.

TRL (``trl.GRPOTrainer``, checked against TRL 1.16) takes two things from
this module::

    from stitch.integrations.trl import StitchGRPO

    sg = StitchGRPO(store="file:///runs/a", run_id="run-1", gateway="http://gateway:9000",
                    pool="file:/runs/a/pool", work_dir="/scratch/versions")
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=...,
                          reward_funcs=[...], rollout_func=sg.rollout_func,
                          callbacks=[sg.callback])

``sg.rollout_func`` is TRL's ``rollout_func(prompts, trainer) -> dict``: it
tokenizes the prompts with the trainer's tokenizer, sends them concurrently
through the Stitch gateway (SGLang's ``/generate`` or vLLM's
``/v1/completions``), each constrained to the version the trainer holds
(``exact`` when ``lag=0``, else ``min_version = version - lag``), retries the
answers Stitch's contract calls retryable (409 ``WeightVersionNotReady``,
503 with ``Retry-After``, a replica that went away) until ``retry_deadline``,
and returns the completion ids, the engines' log-probabilities and each
sample's ``stitch_version_start`` / ``stitch_version_end`` /
``stitch_staleness``, which TRL passes to the reward functions as keyword
arguments.

``sg.callback`` is a ``transformers.TrainerCallback``: at the start of
training it claims the run (or takes one already claimed at the boot
version), and after every optimizer step it encodes an XOR delta of the
model (a FULL anchor every ``anchor_every`` versions), publishes it with the
pool's wake and, when the next rollouts need it (``lag=0``), waits up to
``fleet_timeout`` for a replica that serves it. With ``lag > 0`` the encode
and publish run beside the next step's rollouts and only have to finish
before the next optimizer step reads the weights again.

TRL's synchronous trainer treats every sample as drawn from the weights it
holds: without ``use_vllm`` it applies no importance-sampling correction for
the engines' log-probabilities. So a sample generated ``k`` versions behind
the trainer's weights is kept only while ``k <= max_staleness`` (default 0);
older ones are dropped from the loss (an all-zero ``env_mask``, TRL's mask
of tokens the model did not produce) and counted. Kept stale samples still
carry the engines' log-probabilities, which TRL's off-policy sequence mask
(``GRPOConfig(off_policy_mask_threshold=...)``) compares with the trainer's
own to drop sequences that drifted too far.

Only one trainer process publishes (the main process); every process knows
the version number without asking, since each optimizer step publishes
exactly one: ``boot_version + global_step``.
"""

from __future__ import annotations

import collections
import dataclasses
import email.utils
import http.client
import json
import logging
import os
import shutil
import struct
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import stitch
from stitch.errors import InvalidArgument, StitchError

try:
    from transformers import TrainerCallback
except ImportError as _error:  # pragma: no cover - only without transformers
    raise ImportError("stitch.integrations.trl needs transformers (and TRL): "
                      "pip install trl") from _error

log = logging.getLogger("stitch.trl")

APIS = ("sglang", "vllm")
# The statuses Stitch's sidecars and gateway answer when another try (later,
# or on another replica) can succeed.
_RETRYABLE = (409, 502, 503, 504)
_INDEX = "model.safetensors.index.json"
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


class RolloutFailed(StitchError):
    """A rollout request was refused for good, or stayed refused until the
    retry deadline; the message names the last answer."""


@dataclasses.dataclass
class Sample:
    """One answer as the fleet stamped it."""

    prompt_ids: List[int]
    completion_ids: List[int]
    logprobs: List[float]
    version_start: int
    version_end: int
    spans: Any
    replica: Optional[str]
    attempts: int


@dataclasses.dataclass
class StepRecord:
    """What one optimizer step did with Stitch (times in seconds)."""

    step: int
    version: int
    kind: str = ""
    payload_bytes: int = 0
    encode_s: float = 0.0
    publish_s: float = 0.0
    blocked_s: float = 0.0       # the trainer waited on Stitch (encode/publish/fleet)
    fleet_s: Optional[float] = None  # publish -> every replica in rotation serves it
    rollout_s: float = 0.0
    sample_versions: Dict[int, int] = dataclasses.field(default_factory=dict)
    dropped_stale: int = 0
    retries: int = 0
    reward: Optional[float] = None
    ended_at: float = 0.0        # time.monotonic() when the optimizer step ended


def _checkpoint_tensors(directory: str) -> Dict[str, str]:
    """name -> dtype ("float32", "bfloat16", ...) of a safetensors checkpoint
    directory, from the files' headers alone."""
    index = os.path.join(directory, _INDEX)
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not files:
        raise InvalidArgument(f"stitch: {directory} holds no safetensors files; pass "
                              "checkpoint_dir=, the boot checkpoint the fleet loaded",
                              "INVALID_ARGUMENT")
    out: Dict[str, str] = {}
    for name in files:
        with open(os.path.join(directory, name), "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for tensor, info in header.items():
            if tensor == "__metadata__":
                continue
            dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise InvalidArgument(f"stitch: {name}: tensor {tensor} has dtype "
                                      f"{info['dtype']}, which the trainer cannot publish",
                                      "INVALID_ARGUMENT")
            out[tensor] = dtype
    return out


class _Http:
    """Keep-alive HTTP/1.1 connections, one per thread and host."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._local = threading.local()

    def request(self, method: str, url: str, body: Optional[bytes] = None,
                headers: Optional[Mapping[str, str]] = None) -> Tuple[int, bytes, Dict[str, str]]:
        parts = urllib.parse.urlsplit(url)
        key = (parts.hostname, parts.port)
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        path = parts.path + ("?" + parts.query if parts.query else "")
        for attempt in (0, 1):
            conn = conns.get(key)
            if conn is None:
                conn = conns[key] = http.client.HTTPConnection(parts.hostname, parts.port,
                                                               timeout=self.timeout)
            try:
                conn.request(method, path, body=body, headers=dict(headers or {}))
                response = conn.getresponse()
                data = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conns.pop(key, None)
                return response.status, data, {k.lower(): v for k, v in response.getheaders()}
            except (ConnectionError, http.client.HTTPException, OSError):
                conn.close()
                conns.pop(key, None)
                # A kept-alive connection the server closed: one fresh try.
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")


def _retry_after(headers: Mapping[str, str], default: float) -> float:
    value = headers.get("retry-after")
    if value is None:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default  # unreadable: the client's own backoff
    return max(0.0, when.timestamp() - time.time())


def _error_text(status: int, body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return f"{status} {body[:200]!r}"
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        return f"{status} {err.get('type', '')}: {err.get('message', '')}"
    if isinstance(doc, dict) and "message" in doc:
        return f"{status} {doc.get('message')}"
    return f"{status} {str(doc)[:200]}"


class StitchGRPO:
    """The rollout function and the callback of one TRL GRPO run on Stitch.

    ``store`` and ``run_id``: the store the fleet follows and the run;
    ``gateway``: the Stitch gateway's URL (or one sidecar's);
    ``pool``: the replicas to wake after each publish (``static:``,
    ``file:`` or ``dns:`` spec; None: the gateway wakes them when a request
    waits); ``work_dir``: where version directories are written before they
    are published (each is removed once published unless ``keep_versions``);
    ``checkpoint_dir``: the boot checkpoint (default: the model's
    ``name_or_path``), whose tensor names and dtypes every version has;
    ``api``: ``"sglang"`` (``/generate``) or ``"vllm"`` (``/v1/completions``,
    with ``served_model`` as the model name); ``lag`` and ``max_staleness``:
    see the module's text; ``anchor_every``: a FULL version every N
    versions (0: DELTAs only after the boot checkpoint), or a function of
    the version number that says whether it is FULL;
    ``fleet_timeout`` / ``fleet_grace``: with ``lag=0``, how long the
    trainer waits after a publish for the whole fleet to serve it, and after
    how long one replica serving it is enough;
    ``concurrency``: rollout requests in flight at once;
    ``seed``: when set, each request carries a seed drawn from it, the step
    and the sample (repeatable sampling on engines that honour it);
    ``token``: the fleet's bearer token, sent with every request;
    ``record_samples``: keep every answer in ``samples`` (for checks).
    """

    def __init__(self, *, store: str, run_id: str, gateway: str, work_dir: str,
                 pool: Optional[str] = None, checkpoint_dir: Optional[str] = None,
                 cache_dir: Optional[str] = None, boot_version: int = 0, api: str = "sglang",
                 served_model: str = "policy", lag: int = 0, max_staleness: int = 0,
                 anchor_every: "int | Callable[[int], bool]" = 0, concurrency: int = 32,
                 request_timeout: float = 300.0,
                 retry_deadline: float = 120.0, fleet_timeout: float = 60.0,
                 fleet_grace: float = 5.0,
                 seed: Optional[int] = None, token: Optional[str] = None,
                 affinity_header: Optional[str] = "X-Session-Id", keep_versions: bool = False,
                 measure_fleet: bool = True, record_samples: bool = False) -> None:
        if api not in APIS:
            raise InvalidArgument(f"stitch: api must be one of {APIS}, not {api!r}",
                                  "INVALID_ARGUMENT")
        if not callable(anchor_every) and int(anchor_every) < 0:
            raise InvalidArgument(f"stitch: anchor_every must be >= 0 or a function of the "
                                  f"version, not {anchor_every!r}", "INVALID_ARGUMENT")
        for name, value in (("lag", lag), ("max_staleness", max_staleness)):
            if int(value) < 0:
                raise InvalidArgument(f"stitch: {name} must be >= 0, not {value}",
                                      "INVALID_ARGUMENT")
        if concurrency < 1:
            raise InvalidArgument("stitch: concurrency must be >= 1", "INVALID_ARGUMENT")
        self.store_uri, self.run_id = store, run_id
        self.gateway = gateway.rstrip("/")
        self.pool, self.work_dir = pool, work_dir
        self.checkpoint_dir, self.cache_dir = checkpoint_dir, cache_dir
        self.boot_version = int(boot_version)
        self.api, self.served_model = api, served_model
        self.lag, self.max_staleness = int(lag), int(max_staleness)
        self.anchor_every = anchor_every if callable(anchor_every) else int(anchor_every)
        self.concurrency = int(concurrency)
        self.retry_deadline, self.fleet_timeout = retry_deadline, fleet_timeout
        self.fleet_grace = fleet_grace
        self.seed, self.token = seed, token
        self.affinity_header, self.keep_versions = affinity_header, keep_versions
        self.measure_fleet = measure_fleet
        # (trainer version, sample, dropped) of every rollout, when asked.
        self.record_samples = record_samples
        self.samples: List[Tuple[int, Sample, bool]] = []
        self._http = _Http(request_timeout)
        self._pool_executor = ThreadPoolExecutor(max_workers=self.concurrency,
                                                 thread_name_prefix="stitch-rollout")
        self._lock = threading.Lock()
        self._store: Optional[stitch.Store] = None
        self._encoder: Optional[stitch.DeltaEncoder] = None
        self._dtypes: Dict[str, str] = {}
        self._publisher: Optional[threading.Thread] = None
        self._publish_error: Optional[BaseException] = None
        self._is_main = True
        # The version whose weights the trainer holds (the rollouts' target).
        self.version = self.boot_version
        self.history: List[StepRecord] = []
        self._pending: Dict[int, StepRecord] = {}  # version -> record of its step
        self._rollout_round = 0
        self.counters: Dict[str, int] = collections.Counter()
        self.callback = _Callback(self)

    # --- rollouts ---------------------------------------------------------------

    def rollout_func(self, prompts: Sequence[Any], trainer: Any) -> Dict[str, Any]:
        """TRL's ``rollout_func``: one completion per prompt (TRL repeats each
        prompt ``num_generations`` times in a row), from the fleet."""
        tokenizer = trainer.processing_class
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        args = trainer.args
        mode = "train" if getattr(trainer.model, "training", True) else "eval"
        group = int(getattr(trainer, "num_generations", 1) if mode == "train"
                    else getattr(trainer, "num_generations_eval", 1) or 1)
        step = int(trainer.state.global_step)
        version = self.boot_version + step if mode == "train" else self.version
        self.version = version
        round_no = self._rollout_round
        self._rollout_round += 1
        ids = [self._tokenize(tokenizer, p) for p in prompts]
        sampling = {
            "max_new_tokens": int(args.max_completion_length),
            "temperature": float(args.temperature),
            "top_p": float(getattr(args, "top_p", 1.0) or 1.0),
        }
        top_k = getattr(args, "top_k", None)
        if top_k is not None and int(top_k) > 0:
            sampling["top_k"] = int(top_k)
        started = time.monotonic()
        futures = [
            self._pool_executor.submit(self._generate, prompt, sampling, version,
                                       f"{self.run_id}-r{round_no}-g{i // max(group, 1)}",
                                       self._request_seed(round_no, i))
            for i, prompt in enumerate(ids)
        ]
        samples = [f.result() for f in futures]
        elapsed = time.monotonic() - started
        return self._rollout_output(samples, version, step, elapsed)

    def _rollout_output(self, samples: List[Sample], version: int, step: int,
                        elapsed: float) -> Dict[str, Any]:
        staleness = [version - s.version_start for s in samples]
        dropped = [k > self.max_staleness for k in staleness]
        versions = collections.Counter(s.version_start for s, d in zip(samples, dropped) if not d)
        retries = sum(s.attempts - 1 for s in samples)
        with self._lock:
            self.counters["samples"] += len(samples)
            self.counters["dropped_stale"] += sum(dropped)
            self.counters["retries"] += retries
            record = self._pending.get(version)
            if record is None:
                record = self._pending[version] = StepRecord(step=step + 1, version=version + 1)
            record.rollout_s += elapsed
            record.retries += retries
            record.dropped_stale += sum(dropped)
            for v, n in versions.items():
                record.sample_versions[v] = record.sample_versions.get(v, 0) + n
            if self.record_samples:
                self.samples.extend((version, s, d) for s, d in zip(samples, dropped))
        if any(dropped):
            log.info("stitch: %d of %d samples are more than %d version(s) behind v%d and are "
                     "dropped from the loss", sum(dropped), len(samples), self.max_staleness,
                     version)
        out: Dict[str, Any] = {
            "prompt_ids": [s.prompt_ids for s in samples],
            "completion_ids": [s.completion_ids for s in samples],
            "logprobs": [s.logprobs for s in samples],
            "stitch_version_start": [s.version_start for s in samples],
            "stitch_version_end": [s.version_end for s in samples],
            "stitch_staleness": staleness,
            "stitch_replica": [s.replica for s in samples],
        }
        if any(dropped):
            out["env_mask"] = [[0 if d else 1] * len(s.completion_ids)
                               for s, d in zip(samples, dropped)]
        return out

    def _request_seed(self, round_no: int, index: int) -> Optional[int]:
        if self.seed is None:
            return None
        return (self.seed * 1_000_003 + round_no * 65_537 + index) % (1 << 31)

    @staticmethod
    def _tokenize(tokenizer: Any, prompt: Any) -> List[int]:
        if isinstance(prompt, str):
            return list(tokenizer(prompt)["input_ids"])
        # A conversation: the chat template, with the assistant's turn opened.
        out = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        if isinstance(out, Mapping):
            out = out["input_ids"]
        return list(out)

    def constraint(self, version: int) -> Tuple[Optional[int], Optional[int]]:
        """(exact, min_version) for a rollout at trainer version ``version``."""
        if self.lag == 0:
            return version, None
        return None, max(0, version - self.lag)

    def request_body(self, prompt: List[int], sampling: Mapping[str, Any], version: int,
                     seed: Optional[int]) -> Tuple[str, Dict[str, Any]]:
        """(route, JSON body) of one constrained rollout request."""
        if self.api == "sglang":
            params = dict(sampling)
            if seed is not None:
                params["seed"] = seed
            payload: Dict[str, Any] = {"input_ids": prompt, "return_logprob": True,
                                       "sampling_params": params}
            route = "/generate"
        else:
            payload = {"model": self.served_model, "prompt": prompt,
                       "max_tokens": sampling["max_new_tokens"],
                       "temperature": sampling["temperature"], "top_p": sampling["top_p"],
                       "logprobs": 0, "return_token_ids": True}
            if "top_k" in sampling:
                payload["top_k"] = sampling["top_k"]
            if seed is not None:
                payload["seed"] = seed
            route = "/v1/completions"
        exact, least = self.constraint(version)
        if exact is not None:
            payload, _ = stitch.constrain_request(payload, exact=exact)
        else:
            payload, _ = stitch.constrain_request(payload, latest=version, lag=self.lag)
        return route, payload

    def _generate(self, prompt: List[int], sampling: Mapping[str, Any], version: int,
                  session: str, seed: Optional[int]) -> Sample:
        route, payload = self.request_body(prompt, sampling, version, seed)
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.affinity_header:
            headers[self.affinity_header] = session
        deadline = time.monotonic() + self.retry_deadline
        attempts, delay, last = 0, 0.05, ""
        while True:
            attempts += 1
            try:
                status, data, answer_headers = self._http.request("POST", self.gateway + route,
                                                                  body, headers)
            except (ConnectionError, http.client.HTTPException, OSError) as error:
                status, data, answer_headers = 0, str(error).encode(), {}
            if status == 200:
                sample = self._parse(prompt, data, answer_headers, attempts)
                self._check_stamps(sample, version)
                return sample
            last = _error_text(status, data) if status else f"no answer: {data.decode()}"
            if status and status not in _RETRYABLE:
                raise RolloutFailed(f"stitch: {route} answered {last}", "FAILED_PRECONDITION")
            wait = _retry_after(answer_headers, delay)
            if time.monotonic() + wait > deadline:
                raise RolloutFailed(
                    f"stitch: {route} for v{version} still refused after {attempts} attempts in "
                    f"{self.retry_deadline:.0f} s; last answer: {last}", "DEADLINE_EXCEEDED")
            with self._lock:
                self.counters[f"retried_{status or 'unreachable'}"] += 1
            time.sleep(min(wait, 2.0))
            delay = min(delay * 2, 1.0)

    def _parse(self, prompt: List[int], data: bytes, headers: Mapping[str, str],
               attempts: int) -> Sample:
        doc = json.loads(data)
        if self.api == "sglang":
            meta = doc.get("meta_info") or {}
            triples = meta.get("output_token_logprobs") or []
            completion = [int(t[1]) for t in triples]
            logprobs = [float(t[0]) for t in triples]
            stamps = meta
        else:
            choice = (doc.get("choices") or [{}])[0]
            completion = [int(t) for t in choice.get("token_ids") or []]
            logprobs = [float(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs")
                                           or [])]
            stamps = doc
        start, end = stamps.get("weight_version_start"), stamps.get("weight_version_end")
        if not isinstance(start, int) or not isinstance(end, int):
            raise RolloutFailed("stitch: the answer carries no weight_version_start/_end: is "
                                f"{self.gateway} a Stitch gateway or sidecar?", "FAILED_PRECONDITION")
        if len(logprobs) != len(completion):
            raise RolloutFailed(f"stitch: the answer has {len(completion)} tokens and "
                                f"{len(logprobs)} log-probabilities", "FAILED_PRECONDITION")
        return Sample(prompt, completion, logprobs, start, end,
                      stamps.get("weight_version_spans"), headers.get("x-stitch-replica"),
                      attempts)

    def _check_stamps(self, sample: Sample, version: int) -> None:
        """A stamp outside the constraint is a broken promise: never learn
        from it."""
        exact, least = self.constraint(version)
        ok = sample.version_start <= sample.version_end and (
            (exact is not None and sample.version_start == sample.version_end == exact)
            or (least is not None and sample.version_start >= least))
        if not ok:
            raise RolloutFailed(
                f"stitch: an answer stamped v{sample.version_start}..v{sample.version_end} breaks "
                f"its constraint ({'exact ' + str(exact) if exact is not None else f'>= {least}'})",
                "INTERNAL")

    # --- publishing ---------------------------------------------------------------

    def _begin(self, model: Any, trainer_state: Any, is_main: bool) -> None:
        self._is_main = is_main
        self.version = self.boot_version + int(trainer_state.global_step)
        if not is_main:
            return
        if int(trainer_state.global_step) != 0:
            raise StitchError("stitch: the trainer resumes at step "
                              f"{trainer_state.global_step}; pass boot_version= the version its "
                              "weights are and start the step count at 0", "FAILED_PRECONDITION")
        checkpoint = self.checkpoint_dir or getattr(model, "name_or_path", None)
        if not checkpoint or not os.path.isdir(checkpoint):
            raise InvalidArgument("stitch: pass checkpoint_dir=, the boot checkpoint the fleet "
                                  f"loaded (the model's name_or_path is {checkpoint!r})",
                                  "INVALID_ARGUMENT")
        self._dtypes = _checkpoint_tensors(checkpoint)
        self._store = stitch.open_store(self.store_uri, self.run_id, self.cache_dir)
        try:
            outcome = stitch.claim_run(self._store, self.run_id, self.boot_version, self.pool)
        except stitch.PointerRewind as error:
            pointer = self._store.read_pointer()
            raise StitchError(
                f"{error.message}. To resume run {self.run_id}, load the weights of {pointer} "
                f"into the model and pass boot_version={pointer.version if pointer else '?'}",
                "FAILED_PRECONDITION") from error
        if outcome.pointer.version != self.boot_version:
            raise StitchError(
                f"stitch: run {self.run_id} is already at {outcome.pointer}, past the boot version "
                f"v{self.boot_version} the model holds; load that version's weights and pass "
                f"boot_version={outcome.pointer.version}", "FAILED_PRECONDITION")
        self._encoder = stitch.DeltaEncoder(self._publishable(model), version=self.boot_version,
                                            run_id=self.run_id)
        os.makedirs(self.work_dir, exist_ok=True)
        log.info("stitch: run %s claimed at v%d; %d tensors publish as %s", self.run_id,
                 self.boot_version, len(self._dtypes), sorted(set(self._dtypes.values())))

    def _publishable(self, model: Any) -> Dict[str, Any]:
        """The model's tensors under the checkpoint's names, in its dtypes:
        the parameters themselves where the dtype matches (read in place),
        else a cast copy."""
        state = model.state_dict()
        missing = sorted(set(self._dtypes) - set(state))
        if missing:
            raise InvalidArgument(f"stitch: the model has no tensor {missing[0]} of the "
                                  f"checkpoint ({len(missing)} missing)", "INVALID_ARGUMENT")
        import torch  # noqa: PLC0415 - present wherever TRL runs

        out = {}
        for name, dtype in self._dtypes.items():
            t = state[name].detach()
            want = getattr(torch, dtype)
            if t.dtype != want:
                t = t.to(want)
            if t.device.type != "cpu":
                t = t.cpu()
            out[name] = t.contiguous()
        return out

    def _before_optimizer_step(self) -> None:
        """The optimizer is about to change the weights: the last encode
        must have read them."""
        self._join_publisher()

    def _after_step(self, model: Any, trainer_state: Any) -> None:
        version = self.boot_version + int(trainer_state.global_step)
        self.version = version
        if not self._is_main:
            return
        self._join_publisher()
        with self._lock:
            record = self._pending.pop(version - 1, None) or StepRecord(
                step=int(trainer_state.global_step), version=version)
        record.step, record.version = int(trainer_state.global_step), version
        self.history.append(record)
        started = record.ended_at = time.monotonic()
        tensors = self._publishable(model)
        if self.lag == 0:
            self._publish(tensors, record)
            self._wait_for_fleet(version, record)
            record.blocked_s = time.monotonic() - started
        else:
            record.blocked_s = time.monotonic() - started  # the cast copies, if any
            self._publisher = threading.Thread(target=self._publish_async, args=(tensors, record),
                                               name="stitch-publish", daemon=True)
            self._publisher.start()

    def _publish_async(self, tensors: Mapping[str, Any], record: StepRecord) -> None:
        try:
            self._publish(tensors, record)
        except BaseException as error:  # noqa: BLE001 - raised in the trainer's thread
            self._publish_error = error

    def _join_publisher(self) -> None:
        if self._publisher is not None:
            started = time.monotonic()
            self._publisher.join()
            self._publisher = None
            if self.history:
                self.history[-1].blocked_s += time.monotonic() - started
        if self._publish_error is not None:
            error, self._publish_error = self._publish_error, None
            raise error

    def _full(self, version: int) -> bool:
        if callable(self.anchor_every):
            return bool(self.anchor_every(version))
        return self.anchor_every > 0 and version % self.anchor_every == 0

    def _publish(self, tensors: Mapping[str, Any], record: StepRecord) -> None:
        assert self._encoder is not None and self._store is not None
        version = self._encoder.version + 1
        if version != record.version:
            raise StitchError(f"stitch: the encoder is at v{self._encoder.version} but step "
                              f"{record.step} publishes v{record.version}", "INTERNAL")
        out_dir = os.path.join(self.work_dir, stitch.VersionRef(self.run_id, version).dir_name)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)  # left by a crash before its publish; never published
        full = self._full(version)
        t0 = time.monotonic()
        result = self._encoder.encode(tensors, out_dir, full=full)
        t1 = time.monotonic()
        stitch.publish_version(self._store, result["dir"], self.run_id, self.pool)
        t2 = time.monotonic()
        record.kind = "FULL" if full else "DELTA"
        record.payload_bytes = int(result.get("payload_bytes", result.get("checkpoint_bytes", 0)))
        record.encode_s, record.publish_s = t1 - t0, t2 - t1
        if not self.keep_versions:
            shutil.rmtree(out_dir, ignore_errors=True)
        if self.measure_fleet and self.lag > 0:
            threading.Thread(target=self._measure_fleet, args=(version, t2, record),
                             name="stitch-fleet", daemon=True).start()

    def fleet(self, client: Optional["_Http"] = None,
              urls: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
        """Each replica's ``url``, ``reachable``, ``ready`` and ``applied``
        version: asked of the pool's replicas themselves (``/server_info``;
        ``urls``, else discovered now) when there is a pool, else of the
        gateway (``/replicas``, as fresh as its last poll)."""
        client = client or self._http
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if self.pool is None:
            status, data, _ = client.request("GET", self.gateway + "/replicas", None, headers)
            if status != 200:
                raise StitchError(f"stitch: {self.gateway}/replicas answered "
                                  f"{_error_text(status, data)}", "UNAVAILABLE")
            doc = json.loads(data)
            rows = doc if isinstance(doc, list) else doc.get("replicas", [])
            return [{"url": r.get("url"), "reachable": bool(r.get("reachable")),
                     "ready": bool(r.get("ready")), "applied": r.get("applied_version")}
                    for r in rows]
        out = []
        for url in self._pool_urls() if urls is None else urls:
            row: Dict[str, Any] = {"url": url, "reachable": False, "ready": False, "applied": None}
            try:
                status, data, _ = client.request("GET", url.rstrip("/") + "/server_info", None,
                                                 headers)
                if status == 200:
                    info = json.loads(data)
                    row.update(reachable=True, ready=bool(info.get("ready")),
                               applied=info.get("applied_version"))
            except (OSError, ValueError, http.client.HTTPException):
                pass
            out.append(row)
        return out

    def _pool_urls(self) -> List[str]:
        from stitch.pools.base import SpecPool  # noqa: PLC0415

        return list(SpecPool(self.pool).discover_replicas())

    @staticmethod
    def _serving(rows: Sequence[Mapping[str, Any]], version: int) -> Tuple[bool, bool]:
        """(every reachable replica serves ``version`` or newer and one of
        them is in rotation, one replica in rotation serves it)."""
        rows = [r for r in rows if r.get("reachable", True)]
        serving = [isinstance(r.get("applied"), int) and r["applied"] >= version for r in rows]
        whole = any(r.get("ready") for r in rows) and all(serving)
        return whole, any(ok and r.get("ready") for ok, r in zip(serving, rows))

    def fleet_serves(self, version: int, client: Optional["_Http"] = None,
                     whole: bool = True) -> bool:
        """Every reachable replica (``whole``; else one replica in rotation)
        serves ``version`` or newer, and one of them is in rotation."""
        return self._serving(self.fleet(client), version)[0 if whole else 1]

    def _poll_fleet(self, version: int, published_at: float, record: StepRecord,
                    client: "_Http", enough_after: Optional[float] = None) -> bool:
        """Until the whole fleet serves ``version`` (recorded in
        ``record.fleet_s``), or, once ``enough_after`` seconds have passed,
        one replica in rotation does; False after ``fleet_timeout``. The
        pool's replicas are discovered once, then asked once a round."""
        deadline = published_at + self.fleet_timeout
        urls: Optional[List[str]] = None
        while time.monotonic() < deadline:
            try:
                if urls is None and self.pool is not None:
                    urls = self._pool_urls()
                whole, one = self._serving(self.fleet(client, urls), version)
                if whole:
                    record.fleet_s = time.monotonic() - published_at
                    return True
                if one and enough_after is not None and \
                        time.monotonic() - published_at > enough_after:
                    return True
            except (StitchError, OSError, ValueError, http.client.HTTPException):
                pass
            time.sleep(0.002)
        return False

    def _wait_for_fleet(self, version: int, record: StepRecord) -> None:
        """Until the fleet serves ``version``, which the next step's exact
        pins need. A replica that stays behind holds the trainer for
        ``fleet_grace`` seconds at most, as long as another serves the
        version; past ``fleet_timeout`` the rollouts' own retries take
        over."""
        published_at = time.monotonic()
        if not self._poll_fleet(version, published_at, record, self._http,
                                enough_after=self.fleet_grace):
            log.warning("stitch: no replica serves v%d %.0f s after its publish", version,
                        self.fleet_timeout)
        elif record.fleet_s is None and self.measure_fleet:
            log.warning("stitch: a replica is still behind v%d %.0f s after its publish; "
                        "rollouts go on on those that serve it", version, self.fleet_grace)
            threading.Thread(target=self._measure_fleet, args=(version, published_at, record),
                             name="stitch-fleet", daemon=True).start()

    def _measure_fleet(self, version: int, published_at: float, record: StepRecord) -> None:
        self._poll_fleet(version, published_at, record, _Http(5.0))

    def _end(self) -> None:
        if self._is_main:
            self._join_publisher()

    def close(self) -> None:
        """Finishes a publish still running and stops the request threads."""
        self._end()
        self._pool_executor.shutdown(wait=True)


class _Callback(TrainerCallback):
    """TRL's trainer calls these; they hand over to the StitchGRPO."""

    def __init__(self, owner: StitchGRPO) -> None:
        self.owner = owner

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        self.owner._begin(model, state, bool(getattr(state, "is_world_process_zero", True)))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.owner._before_optimizer_step()

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                    **kwargs: Any) -> None:
        self.owner._after_step(model, state)

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, float]] = None,
               **kwargs: Any) -> None:
        if logs and "reward" in logs and self.owner.history:
            record = self.owner.history[-1]
            if record.step == state.global_step:
                record.reward = float(logs["reward"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.owner._end()


__all__ = ["StitchGRPO", "StepRecord", "Sample", "RolloutFailed", "APIS"]
