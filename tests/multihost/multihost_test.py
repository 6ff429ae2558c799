"""Stitch across hosts, on one machine: every host a Linux network namespace.

Run as root by `make test-multihost` with the project's venv Python:
    .venv/bin/python tests/multihost/multihost_test.py --stitch build/src/stitch/cli/stitch

Hosts, joined by veth pairs to a bridge in a switch namespace (10.213.0.0/24):
    s3       .2    the moto S3 server (tests/s3_moto.py), SigV4 checked
    dns      .3    dnsmasq: replicas.stitch.test -> every replica host's address
    gateway  .4    stitch gateway --pool dns:replicas.stitch.test:8000
    trainer  .5    claims the run, publishes FULL and DELTA versions to S3 and,
                   from the same host, sends constrained rollout requests
                   through the gateway
    r1..r4   .11-  a reference engine and its sidecar, listening on the host's
                   address, following the store on S3

During the run: r3's link goes down while two versions are published, then
comes back and must catch up before it serves again; r4 joins by its address
appearing in DNS; r1 leaves by its address leaving DNS. Every response must
satisfy its constraint and name only published versions. Prints
publish-to-whole-fleet convergence p50/p95 and the counts.

Every process runs inside a namespace of this run; all of them are killed and
the namespaces deleted on any exit (finally, SIGTERM, SIGINT, SIGHUP). A run
killed with SIGKILL leaves them behind: each run first removes those of runs
whose driver is gone (names carry the driver's pid).
"""

import argparse
import atexit
import ctypes
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PREFIX = "stxmh"
SUBNET = "10.213.0"
NAME = "replicas.stitch.test"
SIDECAR_PORT = 8000
GATEWAY_PORT = 8080
RUN_ID = "mh"
CLONE_NEWNET = 0x40000000
START_DEADLINE_S = 120.0
CONVERGE_DEADLINE_S = 60.0
POLL_S = 0.02  # polling interval while waiting on a condition, bounded by a deadline

ADDRESSES = {"s3": 2, "dns": 3, "gateway": 4, "trainer": 5, "r1": 11, "r2": 12, "r3": 13, "r4": 14}


class TestFailure(Exception):
    pass


def log(message):
    print(f"multihost: {message}", flush=True)


def address(host):
    return f"{SUBNET}.{ADDRESSES[host]}"


def sh(*argv, check=True, **kwargs):
    r = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    if check and r.returncode != 0:
        raise TestFailure(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def driver_alive(pid):
    """Whether `pid` is a live (not zombie) run of this driver."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return state != "Z" and b"multihost_test" in cmdline


def kill_namespace_processes(ns):
    """SIGTERM everything in `ns`, then SIGKILL what is left (bounded)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not sh("ip", "netns", "pids", ns, check=False).stdout.split():
                return
            time.sleep(POLL_S)


def delete_namespace(ns):
    kill_namespace_processes(ns)
    sh("ip", "netns", "del", ns, check=False)
    shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def remove_stale():
    """Namespaces and links of earlier runs whose driver is gone."""
    pattern = re.compile(rf"^{PREFIX}-(\d+)-")
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = pattern.match(ns)
        if m and not driver_alive(int(m.group(1))):
            log(f"removing stale namespace {ns}")
            delete_namespace(ns)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        m = re.match(r"^\d+: (sx(\d+)[a-z]\d+[ab])[@:]", line)
        if m and not driver_alive(int(m.group(2))):
            sh("ip", "link", "del", m.group(1), check=False)
    if os.path.isdir("/etc/netns"):
        for name in os.listdir("/etc/netns"):
            m = pattern.match(name)
            if m and not driver_alive(int(m.group(1))):
                shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


class Network:
    """The hosts: one namespace each, on a bridge in a switch namespace."""

    def __init__(self):
        self.run = os.getpid()
        self.switch = f"{PREFIX}-{self.run}-net"
        self.namespaces = []

    def ns(self, host):
        return f"{PREFIX}-{self.run}-{host}"

    def port(self, host):
        return f"sx{self.run}p{ADDRESSES[host]}b"

    def create(self):
        self._add_ns(self.switch)
        sh("ip", "netns", "exec", self.switch, "ip", "link", "add", "br0", "type", "bridge")
        sh("ip", "netns", "exec", self.switch, "ip", "link", "set", "br0", "up")
        for host in ADDRESSES:
            ns = self.ns(host)
            self._add_ns(ns)
            inner = f"sx{self.run}p{ADDRESSES[host]}a"
            outer = self.port(host)
            sh("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "netns", self.switch)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "name", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address(host)}/24", "dev", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            sh("ip", "netns", "exec", self.switch, "ip", "link", "set", outer, "master", "br0")
            sh("ip", "netns", "exec", self.switch, "ip", "link", "set", outer, "up")
            # The resolver every process of this host uses (ip netns exec
            # mounts /etc/netns/<ns>/resolv.conf over /etc/resolv.conf).
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/resolv.conf", "w") as f:
                f.write(f"nameserver {address('dns')}\noptions timeout:1 attempts:2\n")

    def _add_ns(self, ns):
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def set_link(self, host, up):
        sh("ip", "netns", "exec", self.switch, "ip", "link", "set", self.port(host),
           "up" if up else "down")

    def destroy(self):
        for ns in reversed(self.namespaces):
            delete_namespace(ns)
        self.namespaces = []


def enter_namespace(ns):
    """Moves the calling thread into `ns` (network namespaces are per thread)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
    finally:
        os.close(fd)


def http_call(method, host, port, path, body=None, timeout=10.0, headers=None):
    """(status, body bytes, headers); raises OSError when no answer came."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        conn.close()



class Fleet:
    def __init__(self, args, net, work):
        self.args = args
        self.net = net
        self.work = work
        self.procs = {}
        self.env = dict(os.environ)
        self.moto_stdin = None

    def stitch(self, host, *argv, timeout=300):
        r = subprocess.run(["ip", "netns", "exec", self.net.ns(host), self.args.stitch, *argv],
                           env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=timeout)
        if r.returncode != 0:
            raise TestFailure(f"stitch {' '.join(argv)} on {host} failed: {r.stderr.strip()}")
        return r.stdout

    def spawn(self, name, host, argv, stdin=subprocess.DEVNULL):
        out = open(os.path.join(self.work, f"{name}.out"), "w")
        err = open(os.path.join(self.work, f"{name}.err"), "w")
        p = subprocess.Popen(["ip", "netns", "exec", self.net.ns(host), *argv], env=self.env,
                             stdin=stdin, stdout=out, stderr=err)
        self.procs[name] = p
        return p

    def wait_output(self, name, regex, deadline_s=START_DEADLINE_S):
        path = os.path.join(self.work, f"{name}.out")
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            with open(path) as f:
                m = re.search(regex, f.read())
            if m:
                return m
            if self.procs[name].poll() is not None:
                break
            time.sleep(POLL_S)
        raise TestFailure(f"{name} did not print /{regex}/: {self.tail(name)}")

    def tail(self, name):
        with open(os.path.join(self.work, f"{name}.err")) as f:
            return f.read()[-2000:]

    def stop(self, name):
        p = self.procs.pop(name)
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    # ---- the hosts ----

    def start_s3(self):
        p = self.spawn("s3", "s3", [self.args.python, os.path.join(self.args.source, "tests/s3_moto.py"),
                                    "--host", address("s3")], stdin=subprocess.PIPE)
        self.moto_stdin = p.stdin
        m = self.wait_output("s3", r"(\{.*\})\n")
        info = json.loads(m.group(1))
        self.env.update({
            "AWS_ACCESS_KEY_ID": info["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": info["secret_access_key"],
            "AWS_REGION": info["region"],
            "AWS_ENDPOINT_URL_S3": info["endpoint"],
            "AWS_EC2_METADATA_DISABLED": "true",
        })
        self.env.pop("AWS_SESSION_TOKEN", None)
        self.store = f"s3://{info['bucket']}/multihost"
        log(f"s3 host: moto at {info['endpoint']}, store {self.store}")

    def start_dns(self, members):
        self.hosts_file = os.path.join(self.work, "replicas.hosts")
        self.write_hosts(members)
        self.spawn("dns", "dns", [
            "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
            "--bind-interfaces", f"--listen-address={address('dns')}", "--port=53",
            f"--addn-hosts={self.hosts_file}", "--local=/stitch.test/", "--local-ttl=0",
            "--user=root", "--pid-file=", "--log-facility=-"])
        self.wait_resolves(members)

    def write_hosts(self, members):
        with open(self.hosts_file + ".tmp", "w") as f:
            for host in members:
                f.write(f"{address(host)} {NAME}\n")
        os.replace(self.hosts_file + ".tmp", self.hosts_file)

    def set_dns(self, members):
        self.write_hosts(members)
        self.procs["dns"].send_signal(signal.SIGHUP)  # dnsmasq re-reads --addn-hosts
        self.wait_resolves(members)

    def wait_resolves(self, members):
        want = sorted(address(h) for h in members)
        deadline = time.monotonic() + 30
        got = None
        while time.monotonic() < deadline:
            r = sh("ip", "netns", "exec", self.net.ns("gateway"), "getent", "ahostsv4", NAME,
                   check=False)
            got = sorted({line.split()[0] for line in r.stdout.splitlines() if line.strip()})
            if got == want:
                return
            time.sleep(POLL_S)
        raise TestFailure(f"{NAME} resolves to {got}, not {want}: {self.tail('dns')}")

    def start_replica(self, host):
        base = os.path.join(self.work, "ckpt", "base")
        self.spawn(f"{host}-engine", host, [self.args.stitch, "engine", "--model", base, "--port", "0",
                                            "--run-id", RUN_ID])
        engine = self.wait_output(f"{host}-engine", r"(http://127\.0\.0\.1:\d+)").group(1)
        self.spawn(f"{host}-sidecar", host, [
            self.args.stitch, "sidecar", "--store", self.store, "--run-id", RUN_ID,
            "--engine", "sglang", "--engine-url", engine, "--base-checkpoint", base,
            "--local-checkpoint", os.path.join(self.work, f"local-{host}"),
            "--reconcile-interval", "1", "--watchdog-interval", "0.5",
            "--store-outage-limit", "2",
            "--host", address(host), "--port", str(SIDECAR_PORT)])
        self.wait_output(f"{host}-sidecar", rf"listening on http://{re.escape(address(host))}:{SIDECAR_PORT}")

    def stop_replica(self, host):
        self.stop(f"{host}-sidecar")
        self.stop(f"{host}-engine")

    def start_gateway(self):
        self.spawn("gateway", "gateway", [
            self.args.stitch, "gateway", "--pool", f"dns:{NAME}:{SIDECAR_PORT}",
            "--host", address("gateway"), "--port", str(GATEWAY_PORT), "--poll-interval", "0.25",
            "--probe-timeout", "1", "--admission-wait", "20"])
        self.wait_output("gateway", rf"listening on http://{re.escape(address('gateway'))}:{GATEWAY_PORT}")

    def close(self):
        if self.moto_stdin is not None:
            try:
                self.moto_stdin.close()
            except OSError:
                pass
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


class TrainerHost:
    """Threads that live in the trainer's namespace: probes and rollouts."""

    def __init__(self, net):
        self.ns = net.ns("trainer")

    def call(self, fn, *args):
        result = {}

        def body():
            try:
                enter_namespace(self.ns)
                result["value"] = fn(*args)
            except BaseException as e:  # reported to the caller
                result["error"] = e

        t = threading.Thread(target=body)
        t.start()
        t.join()
        if "error" in result:
            raise result["error"]
        return result["value"]

    def thread(self, fn, *args):
        def body():
            enter_namespace(self.ns)
            try:
                fn(*args)
            except TestFailure as e:
                log(str(e))

        t = threading.Thread(target=body, daemon=True)
        t.start()
        return t


def server_info(host):
    try:
        status, body, _ = http_call("GET", address(host), SIDECAR_PORT, "/server_info", timeout=2)
        return json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        return None


def wait_applied(hosts, version, deadline_s=CONVERGE_DEADLINE_S):
    """Seconds until every host serves `version` (ready), from now; per host."""
    start = time.monotonic()
    done = {}
    while time.monotonic() - start < deadline_s:
        for host in hosts:
            if host in done:
                continue
            info = server_info(host)
            if info and info.get("ready") and info.get("applied_version") == version:
                done[host] = time.monotonic() - start
        if len(done) == len(hosts):
            return done
        time.sleep(POLL_S)
    raise TestFailure(f"not every replica of {hosts} reached version {version} within "
                      f"{deadline_s:.0f} s: {done}")


def gateway_replicas():
    try:
        status, body, _ = http_call("GET", address("gateway"), GATEWAY_PORT, "/replicas", timeout=2)
        if status != 200:
            return []
        doc = json.loads(body)
        return doc.get("replicas", doc) if isinstance(doc, dict) else doc
    except (OSError, ValueError):
        return []


def wait_gateway(predicate, what, deadline_s=30.0):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        replicas = gateway_replicas()
        if predicate(replicas):
            return
        time.sleep(POLL_S)
    raise TestFailure(f"the gateway never {what}: {gateway_replicas()}")


def replica_url(host):
    return f"http://{address(host)}:{SIDECAR_PORT}"


def in_rotation(replicas, host):
    return any(r.get("url") == replica_url(host) and r.get("ready") and r.get("reachable")
               for r in replicas)


class Rollouts:
    """Rollout clients: constrained requests through the gateway."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latest = 0          # the newest version whose pointer moved
        self.publishing = 0      # the newest version whose publish started
        self.records = []
        self.stop = threading.Event()

    def constraint(self, rng):
        with self.lock:
            latest = self.latest
        kind = rng.random()
        if kind < 0.2:
            return {}  # any version
        if kind < 0.55:
            return {"min_version": max(latest - 1, 0)}  # a lag of one
        if kind < 0.8:
            return {"min_version": latest}
        return {"exact_version": latest}

    def run(self, seed):
        rng = random.Random(seed)
        while not self.stop.is_set():
            c = self.constraint(rng)
            body = json.dumps({"text": "The policy", "weight_version": c,
                               "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
            sent = time.monotonic()
            rec = {"constraint": c, "sent": sent}
            try:
                status, data, headers = http_call(
                    "POST", address("gateway"), GATEWAY_PORT, "/generate", body=body, timeout=60,
                    headers={"Content-Type": "application/json"})
                rec["status"] = status
                rec["replica"] = headers.get("X-Stitch-Replica", "")
                if status == 200:
                    meta = json.loads(data)["meta_info"]
                    rec["start"] = meta["weight_version_start"]
                    rec["end"] = meta["weight_version_end"]
            except (OSError, ValueError, KeyError) as e:
                rec["status"] = 0
                rec["error"] = str(e)
            rec["received"] = time.monotonic()
            with self.lock:
                rec["published_max"] = self.publishing
                self.records.append(rec)


def percentile(values, p):
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1)))))
    return ordered[k]


def prepare_versions(args, work, count):
    """Checkpoints and version directories 1..count (every fourth FULL)."""
    ckpt = os.path.join(work, "ckpt")
    out = os.path.join(work, "out")
    os.makedirs(out)

    def run(*argv):
        r = subprocess.run([args.stitch, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        if r.returncode != 0:
            raise TestFailure(f"stitch {' '.join(argv)}: {r.stderr.strip()}")

    model = ["--layers", "1", "--hidden", "32", "--heads", "2", "--max-positions", "256"]
    run("engine", "init-model", os.path.join(ckpt, "base"), "--seed", "1", *model)
    kinds = {}
    for v in range(1, count + 1):
        run("engine", "init-model", os.path.join(ckpt, f"c{v}"), "--seed", str(v + 1), *model)
        target = os.path.join(out, f"weight_v{v:06d}")
        if v % 4 == 1:
            run("delta", "full", "--checkpoint", os.path.join(ckpt, f"c{v}"), "--out", target,
                "--version", str(v), "--run-id", RUN_ID)
            kinds[v] = "FULL"
        else:
            run("delta", "encode", "--base", os.path.join(ckpt, f"c{v - 1}"), "--target",
                os.path.join(ckpt, f"c{v}"), "--out", target, "--version", str(v),
                "--base-version", str(v - 1), "--run-id", RUN_ID)
            kinds[v] = "DELTA"
    return out, kinds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stitch", required=True)
    parser.add_argument("--source", default=os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    args.stitch = os.path.abspath(args.stitch)

    if os.geteuid() != 0:
        raise TestFailure("needs root (network namespaces): run as root, as CI does")
    for tool in ("ip", "dnsmasq", "getent"):
        if shutil.which(tool) is None:
            raise TestFailure(f"{tool} is missing: run scripts/install-deps")

    remove_stale()
    net = Network()
    work = tempfile.mkdtemp(prefix="stitch-multihost-")
    fleet = Fleet(args, net, work)
    rollouts = Rollouts()
    cleaned = []

    def cleanup():
        if cleaned:
            return
        cleaned.append(True)
        rollouts.stop.set()
        fleet.close()
        net.destroy()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    atexit.register(cleanup)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    began = time.monotonic()
    try:
        run(args, net, fleet, rollouts, work)
    finally:
        cleanup()
    log(f"done in {time.monotonic() - began:.0f} s; namespaces and processes removed")


def run(args, net, fleet, rollouts, work):
    versions_dir, kinds = prepare_versions(args, work, 12)
    net.create()
    log(f"{len(ADDRESSES)} hosts on {SUBNET}.0/24: " +
        ", ".join(f"{h} {address(h)}" for h in ADDRESSES))
    fleet.start_s3()
    fleet.stitch("trainer", "claim", "--store", fleet.store, "--run-id", RUN_ID, "--boot-version", "0")
    fleet.start_dns(["r1", "r2", "r3"])
    for host in ("r1", "r2", "r3"):
        fleet.start_replica(host)
    trainer = TrainerHost(net)
    trainer.call(wait_applied, ["r1", "r2", "r3"], 0)
    fleet.start_gateway()
    trainer.call(wait_gateway, lambda rs: all(in_rotation(rs, h) for h in ("r1", "r2", "r3")),
                 "saw three ready replicas")

    clients = [trainer.thread(rollouts.run, seed) for seed in range(3)]
    convergence = []   # (version, kind, fleet size, seconds)
    live = ["r1", "r2", "r3"]

    def publish(version):
        """Publishes `version`; seconds from the publish's start until every
        replica in rotation serves it, watched while the publish runs."""
        with rollouts.lock:
            rollouts.publishing = version
        watched = {}
        watcher = trainer.thread(lambda: watched.update(per_host=wait_applied(list(live), version)))
        began = time.monotonic()
        fleet.stitch("trainer", "publish", "--store", fleet.store, "--run-id", RUN_ID, "--pool",
                     f"dns:{NAME}:{SIDECAR_PORT}", os.path.join(versions_dir, f"weight_v{version:06d}"))
        published = time.monotonic() - began
        with rollouts.lock:
            rollouts.latest = version
        watcher.join(CONVERGE_DEADLINE_S + 10)
        if "per_host" not in watched:
            raise TestFailure(f"v{version} did not reach every replica of {live}")
        whole = max(watched["per_host"].values())
        convergence.append((version, kinds[version], len(live), whole))
        log(f"published v{version} ({kinds[version]}): the command took {published:.2f} s; "
            f"{len(live)} replicas serve it {whole:.2f} s after it started")

    for v in (1, 2, 3):
        publish(v)

    # r3 is cut off while two versions are published, then comes back.
    net.set_link("r3", up=False)
    live.remove("r3")
    trainer.call(wait_gateway, lambda rs: not in_rotation(rs, "r3"),
                 "took the cut-off r3 out of rotation")
    # From here on a request can reach r3 only after it comes back.
    out_of_rotation = time.monotonic()
    log("r3 cut off (link down)")
    publish(4)
    publish(5)
    pointer_at_restore = 5
    net.set_link("r3", up=True)
    catch_up = trainer.call(wait_applied, ["r3"], pointer_at_restore)["r3"]
    live.append("r3")
    log(f"r3 restored; caught up to v{pointer_at_restore} {catch_up:.2f} s later")

    # r4 joins: its address appears in DNS once it serves the pointer.
    fleet.start_replica("r4")
    trainer.call(wait_applied, ["r4"], pointer_at_restore)
    fleet.set_dns(["r1", "r2", "r3", "r4"])
    trainer.call(wait_gateway, lambda rs: in_rotation(rs, "r4"), "added r4")
    live.append("r4")
    log("r4 joined through DNS")
    for v in (6, 7, 8):
        publish(v)

    # r1 leaves: its address leaves DNS, then it stops.
    fleet.set_dns(["r2", "r3", "r4"])
    trainer.call(wait_gateway, lambda rs: not any(r.get("url") == replica_url("r1") for r in rs),
                 "dropped r1")
    live.remove("r1")
    left = time.monotonic()
    fleet.stop_replica("r1")
    log("r1 left through DNS")
    for v in (9, 10, 11, 12):
        publish(v)

    rollouts.stop.set()
    for t in clients:
        t.join(timeout=90)
    check(rollouts, convergence, out_of_rotation, pointer_at_restore, left)


def check(rollouts, convergence, out_of_rotation, pointer_at_restore, left):
    records = rollouts.records
    problems = []
    by_status = {}
    served_by = {}
    for rec in records:
        by_status[rec["status"]] = by_status.get(rec["status"], 0) + 1
        if rec["status"] != 200:
            continue
        c = rec["constraint"]
        for field in ("start", "end"):
            v = rec[field]
            if "min_version" in c and v < c["min_version"]:
                problems.append(f"{field} {v} below min_version {c['min_version']}: {rec}")
            if "exact_version" in c and v != c["exact_version"]:
                problems.append(f"{field} {v} is not exact_version {c['exact_version']}: {rec}")
            if v < 0 or v > rec["published_max"]:
                problems.append(f"{field} {v} was never published: {rec}")
        host = next((h for h in ADDRESSES if rec["replica"] == replica_url(h)), rec["replica"])
        served_by[host] = served_by.get(host, 0) + 1
        if host == "r3" and rec["sent"] > out_of_rotation and rec["start"] < pointer_at_restore:
            problems.append(f"r3 served v{rec['start']} after it came back behind: {rec}")
        if host == "r1" and rec["sent"] > left:
            problems.append(f"r1 served a request sent after it left: {rec}")
    ok = by_status.get(200, 0)
    if ok < 20:
        problems.append(f"only {ok} rollouts succeeded")
    if served_by.get("r4", 0) == 0:
        problems.append("r4 never served a rollout after joining")
    unexpected = {s: n for s, n in by_status.items() if s not in (200, 409)}
    if unexpected:
        problems.append(f"answers other than 200 and 409: {unexpected}; "
                        f"{[r for r in records if r['status'] not in (200, 409)][:3]}")
    seconds = [c[3] for c in convergence]
    log(f"convergence, publish to whole fleet ({len(seconds)} publishes): "
        f"p50 {statistics.median(seconds):.2f} s, p95 {percentile(seconds, 95):.2f} s, "
        f"max {max(seconds):.2f} s")
    for version, kind, size, s in convergence:
        log(f"  v{version} {kind:5s} {size} replicas {s:.2f} s")
    log(f"rollouts: {len(records)} sent, {by_status}; served by {dict(sorted(served_by.items()))}")
    if problems:
        for p in problems[:20]:
            log(f"FAIL: {p}")
        raise TestFailure(f"{len(problems)} problem(s)")
    log("every response satisfied its constraint and named only published versions")


if __name__ == "__main__":
    try:
        main()
    except TestFailure as e:
        print(f"multihost: FAILED: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
