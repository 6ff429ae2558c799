"""Checks the deployment files in deploy/ (a CTest test, run with the venv).

- Every Kubernetes manifest in deploy/kubernetes validates, strictly (no
  unknown fields), against the Kubernetes API's JSON schemas shipped inside
  the kubernetes-validate package (scripts/requirements-test.txt): nothing is
  fetched at test time. A deliberately broken copy must fail, so that the
  check cannot pass vacuously.
- What schemas cannot see: readiness on the sidecar's /health and liveness
  elsewhere, the headless service that is the gateway's dns: pool, the
  service-account role annotation, shutdown settings that let rollouts
  finish, and every `stitch` flag the manifests and the Slurm script pass
  exists in the binary under test (`stitch <command> --help`).
- The Slurm script parses (bash -n); the Dockerfile's runtime stage installs
  a package for every shared library the binary links directly.

Prints one line per check; exits 1 with every problem found.
"""

import copy
import os
import re
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "deploy")
KUBERNETES_VERSION = "1.32.0"

problems = []


def fail(message):
    problems.append(message)
    print(f"deploy: FAIL {message}", flush=True)


def ok(message):
    print(f"deploy: ok   {message}", flush=True)


try:
    import kubernetes_validate
    import yaml
except ImportError as e:
    print(f"deploy: {e}: install the test requirements (scripts/install-deps)", file=sys.stderr)
    sys.exit(1)


def load_manifests():
    docs = []
    directory = os.path.join(DEPLOY, "kubernetes")
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".yaml") or name == "kustomization.yaml":
            continue
        with open(os.path.join(directory, name)) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((name, doc))
    return docs


def validate(doc):
    """None when `doc` is valid, else the validator's message."""
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        return None
    except kubernetes_validate.ValidationError as e:
        return f"{e.message} (at {'.'.join(str(p) for p in e.path)})"
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
        return str(e)


def find(docs, kind, name):
    for _, doc in docs:
        if doc.get("kind") == kind and doc["metadata"]["name"] == name:
            return doc
    fail(f"no {kind} {name} in deploy/kubernetes")
    return None


def container(pod_spec, name):
    for c in pod_spec["containers"]:
        if c["name"] == name:
            return c
    fail(f"no container {name}")
    return {}


def stitch_flags(command):
    """The long flags `stitch <command> --help` lists."""
    stitch = os.environ.get("STITCH_BIN")
    if not stitch:
        fail("STITCH_BIN is not set; run the test with ctest")
        return set()
    r = subprocess.run([stitch, command, "--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", r.stdout))


def check_flags(where, command, args):
    known = stitch_flags(command)
    for arg in args:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            if flag not in known:
                fail(f"{where}: `stitch {command}` has no flag {flag}")


def probe_path(probe):
    return (probe or {}).get("httpGet", {}).get("path")


def check_schemas(docs):
    kustomization = os.path.join(DEPLOY, "kubernetes", "kustomization.yaml")
    with open(kustomization) as f:
        listed = set(yaml.safe_load(f)["resources"])
    files = {name for name, _ in docs}
    if listed != files:
        fail(f"kustomization.yaml lists {sorted(listed)}, the directory has {sorted(files)}")
    for name, doc in docs:
        error = validate(doc)
        what = f"{name}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        if error:
            fail(f"{what} does not validate against Kubernetes {KUBERNETES_VERSION}: {error}")
        else:
            ok(f"{what} validates against Kubernetes {KUBERNETES_VERSION} (strict)")
    # The validator must refuse what is broken, or the checks above prove nothing.
    replica = copy.deepcopy(find(docs, "Deployment", "stitch-replica"))
    if replica:
        broken = copy.deepcopy(replica)
        broken["spec"]["template"]["spec"]["containers"][1]["readinessProbe"]["httpGett"] = {}
        wrong_type = copy.deepcopy(replica)
        wrong_type["spec"]["replicas"] = "sixteen"
        for label, doc in (("an unknown field", broken), ("a string replica count", wrong_type)):
            if validate(doc) is None:
                fail(f"the validator accepted a replica Deployment with {label}")
            else:
                ok(f"the validator refuses a replica Deployment with {label}")


def check_semantics(docs):
    replica = find(docs, "Deployment", "stitch-replica")
    service = find(docs, "Service", "stitch-replicas")
    gateway = find(docs, "Deployment", "stitch-gateway")
    account = find(docs, "ServiceAccount", "stitch-replica")
    if not (replica and service and gateway and account):
        return
    pod = replica["spec"]["template"]["spec"]
    sidecar = container(pod, "sidecar")
    engine = container(pod, "engine")
    port = next((p["containerPort"] for p in sidecar.get("ports", []) if p.get("name") == "rollout"),
                None)
    if probe_path(sidecar.get("readinessProbe")) != "/health":
        fail("the sidecar's readiness probe is not GET /health")
    for c in (sidecar, engine):
        if probe_path(c.get("livenessProbe")) == "/health" and c is sidecar:
            fail("the sidecar's liveness probe is /health, which is 503 while it catches up")
        if not c.get("livenessProbe"):
            fail(f"the {c.get('name')} container has no liveness probe")
    # A real engine loads for minutes: its liveness probe must not count
    # before that (a startup probe of 30 minutes, as long as the sidecar's
    # --engine-start-timeout), and must leave room for a /health that waits
    # behind the queue under load.
    startup = engine.get("startupProbe") or {}
    if startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) < 1800:
        fail("the engine has no startup probe allowing 30 minutes for a model to load, so its "
             "liveness probe restarts it while it loads")
    if engine.get("livenessProbe", {}).get("timeoutSeconds", 1) < 10:
        fail("the engine's liveness probe times out in under 10 s; a busy engine's /health "
             "waits behind its queue")
    if pod.get("restartPolicy", "Always") != "Always":
        fail("replica pods must restart their containers (a terminal error exits 3)")
    if sidecar.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        fail("the sidecar's last log line (a terminal error) should be its termination message")
    mounts = {c["name"]: {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
              for c in (engine, sidecar)}
    local = next((a.split("=", 1)[1] for a in sidecar.get("args", [])
                  if a.startswith("--local-checkpoint=")), None)
    shared = set(mounts["engine"].items()) & set(mounts["sidecar"].items())
    if not any(path == local for _, path in shared):
        fail("engine and sidecar do not share the volume of --local-checkpoint")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    sleeps = {c["name"]: c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
              for c in (engine, sidecar)}
    if sleeps["sidecar"] < 5 or sleeps["engine"] <= sleeps["sidecar"] or grace < 120:
        fail(f"shutdown: the sidecar must leave the endpoints first and the engine outlive it, "
             f"with time for rollouts to finish (preStop {sleeps}, grace {grace} s)")
    for c in (engine, sidecar):
        r = c.get("resources", {})
        if not r.get("requests") or r.get("requests") != r.get("limits"):
            fail(f"the {c['name']} container's requests should equal its limits (Guaranteed QoS)")
    if pod.get("serviceAccountName") != account["metadata"]["name"]:
        fail("replica pods do not run as the stitch-replica service account")
    if "eks.amazonaws.com/role-arn" not in account["metadata"].get("annotations", {}):
        fail("the service account has no S3 role annotation (eks.amazonaws.com/role-arn)")
    labels = replica["spec"]["template"]["metadata"]["labels"]
    if service["spec"].get("clusterIP") != "None":
        fail("the replicas' service is not headless (clusterIP: None), so DNS gives one address")
    if any(labels.get(k) != v for k, v in service["spec"]["selector"].items()):
        fail("the headless service does not select the replica pods")
    service_port = service["spec"]["ports"][0]["port"]
    pool = f"--pool=dns:{service['metadata']['name']}.{service['metadata']['namespace']}" \
           f".svc.cluster.local:{service_port}"
    gateway_args = container(gateway["spec"]["template"]["spec"], "gateway").get("args", [])
    if pool not in gateway_args:
        fail(f"the gateway's pool is not the headless service ({pool})")
    if port != service_port or f"--port={port}" not in sidecar.get("args", []):
        fail("the sidecar's --port, its container port and the service port differ")
    if not any(p.get("kind") == "PodDisruptionBudget" for _, p in docs):
        fail("no PodDisruptionBudget for the replicas")
    check_peers_have_a_token("replica.yaml sidecar", sidecar)
    check_flags("replica.yaml sidecar", "sidecar", sidecar.get("args", []))
    check_flags("replica.yaml engine", "engine", engine.get("args", []))
    check_flags("gateway.yaml", "gateway", gateway_args)
    ok("replica readiness, liveness, restarts, shared volume, shutdown, resources, role, "
       "headless dns: pool and flags")


def check_peers_have_a_token(where, sidecar):
    """A sidecar with --peers serves every verified version to whoever presents
    the fleet's token: it refuses to start without one, so the manifest must
    give it one, from a Secret (never a literal in a public file)."""
    args = sidecar.get("args", [])
    if not any(a.startswith("--peers") for a in args):
        return
    env = {e.get("name"): e for e in sidecar.get("env", [])}
    token = env.get("STITCH_AUTH_TOKEN", {})
    from_secret = token.get("valueFrom", {}).get("secretKeyRef", {}).get("name")
    token_file = any(a.startswith("--auth-token-file") for a in args)
    if not (from_secret or token_file):
        fail(f"{where}: --peers without the fleet's token (STITCH_AUTH_TOKEN from a Secret, or "
             f"--auth-token-file): the sidecar refuses to start")
    if "value" in token:
        fail(f"{where}: the fleet's token is written in the manifest; take it from a Secret")


def check_slurm():
    script = os.path.join(DEPLOY, "slurm", "stitch-replicas.sbatch")
    r = subprocess.run(["bash", "-n", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        fail(f"{script} does not parse: {r.stderr.strip()}")
    with open(script) as f:
        text = f.read()
    if not re.search(r"^#SBATCH --nodes=", text, re.M):
        fail("the sbatch script requests no nodes")
    joined = text.replace("\\\n", " ")
    for command in ("sidecar", "engine", "gateway", "wait-ready"):
        for line in re.findall(rf'"\$STITCH_BIN" {command} ([^\n]*)', joined):
            args = [a for a in shlex.split(line, posix=True) if a.startswith("--")]
            check_flags(f"stitch-replicas.sbatch {command}", command, args)
    for line in re.findall(r'"\$STITCH_BIN" sidecar ([^\n]*)', joined):
        if "--peers" in line and "--auth-token-file" not in line:
            fail("stitch-replicas.sbatch: a sidecar with --peers and no --auth-token-file "
                 "refuses to start")
    # The sidecar survives an engine restart: the script must restart the
    # engine on its own, not only when the sidecar exits.
    if not re.search(r'while true; do\s*\n\s*"\$STITCH_BIN" engine', text):
        fail("the Slurm script does not restart an engine that exits while its sidecar waits")
    ok("the Slurm script parses, restarts engines and passes only flags stitch knows")


def check_dockerfile():
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = f.read()
    stages = re.split(r"^FROM ", text, flags=re.M)
    runtime = stages[-1] if len(stages) > 2 else ""
    if not runtime or "COPY --from=build" not in runtime or 'ENTRYPOINT ["stitch"]' not in runtime:
        fail("the Dockerfile has no runtime stage that copies the built stitch as its entrypoint")
        return
    stitch = os.environ.get("STITCH_BIN", "")
    r = subprocess.run(["readelf", "-d", stitch], stdout=subprocess.PIPE, text=True)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", r.stdout)
    if not needed:
        fail(f"cannot read the libraries {stitch} links")
        return
    base = {"libc6", "libstdc++6", "libgcc-s1"}
    resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", subprocess.run(
        ["ldd", stitch], stdout=subprocess.PIPE, text=True).stdout, re.M))
    missing = set()
    for lib in needed:
        path = os.path.realpath(resolved.get(lib, lib))
        owner = subprocess.run(["dpkg", "-S", path], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True).stdout.split(":")[0]
        if owner and owner not in base and not re.search(rf"\b{re.escape(owner)}\b", runtime):
            missing.add(f"{owner} ({lib})")
    if missing:
        fail(f"the Dockerfile's runtime stage lacks {sorted(missing)}")
    else:
        ok(f"the Dockerfile's runtime stage installs every library stitch links ({len(needed)})")


def main():
    docs = load_manifests()
    check_schemas(docs)
    check_semantics(docs)
    check_slurm()
    check_dockerfile()
    if problems:
        print(f"deploy: {len(problems)} problem(s)", file=sys.stderr)
        sys.exit(1)
    print("deploy: every deployment file checked")


if __name__ == "__main__":
    main()
