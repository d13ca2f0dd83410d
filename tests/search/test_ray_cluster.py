"""A real multi-node Ray cluster on this machine: a head and two worker nodes (``ray start``)
declaring fake accelerator resources; profiling tasks must land only where their tp fits."""
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from searchkit import write_space

RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
pytestmark = pytest.mark.skipif(RAY is None, reason="the ray command line is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: worker ports come from slices of 20000-32767: below the kernel's ephemeral ports (where
#: _free_port draws) and above the range local Rays use by default (10002-19999)
_WORKER_PORTS = range(20000, 32768 - 250, 250)
#: seconds a node may take to start, and the cluster to see all its nodes, on a loaded host
START_S = 300


def _node_ports() -> list[str]:
    """Ports of its own for one node: several nodes on one host (and other tests' clusters on
    it) must not meet on Ray's fixed defaults. A node that still meets a taken port exits,
    and is started again on fresh ports."""
    out = []
    for flag in ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
                 "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port"):
        out += [flag, str(_free_port())]
    lo = random.SystemRandom().choice(_WORKER_PORTS)
    return out + ["--min-worker-port", str(lo), "--max-worker-port", str(lo + 249)]


def _start(args, env, log: Path) -> subprocess.Popen:
    # --block keeps `ray start` in the foreground; SIGTERM to it stops exactly the node it started
    with open(log, "ab") as out:
        return subprocess.Popen([RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
                                 *_node_ports(), *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _started(proc: subprocess.Popen, log: Path) -> bool:
    """Wait until the node says it started (True) or its `ray start` exits (False).

    `ray start --block` prints "Ray runtime started." once its processes run, and exits
    when one of them dies; a deadline only guards against a host that never gets to it.
    """
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if b"Ray runtime started" in log.read_bytes():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.2)
    raise RuntimeError(f"`ray start` printed nothing in {START_S} s: {log.read_text()[-2000:]}")


def _node(args, env, tmp_path: Path, name: str, procs: list) -> None:
    """Start one node and wait for it, starting it again (fresh ports) if it exits first."""
    for attempt in range(3):
        log = tmp_path / f"{name}-{attempt}.log"
        proc = _start(args, env, log)
        procs.append(proc)
        if _started(proc, log):
            return
    raise RuntimeError(f"node {name} exited three times: {log.read_text()[-2000:]}")


def _ray_py(code: str, env) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=START_S + 120, check=True).stdout


def _stop(procs: list) -> None:
    """Stop the nodes, workers before the head, then kill whatever of their groups is left.

    SIGTERM goes to `ray start` alone: it drains its node through the head's GCS, then stops
    its own processes. A SIGTERM to the whole group kills the GCS first and leaves every
    `ray start` waiting 30 s for a GCS that is gone.
    """
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is gone: nothing of the node is left
            pass


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A head node with token authentication, as a shared cluster should run: (address, env, procs).

    One for the module: each test's nodes and files are its own, and a head takes seconds to start.
    """
    import ray

    tmp_path = tmp_path_factory.mktemp("head")

    if ray.is_initialized():  # a local Ray of an earlier test in this process: free its cores first
        ray.shutdown()
    port = _free_port()
    # a token of this test's own
    token = tmp_path / "ray_token"
    token.write_text(secrets.token_hex(32))
    # a Ray started earlier in this test session exports RAY_ADDRESS: never inherit it
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env = {**base, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           # the head declares a node dead after this many missed health checks (3 s apart; 5 by
           # default): a raylet that a loaded 2-core host starves for a quarter of a minute is alive
           "RAY_health_check_failure_threshold": "60"}
    procs: list[subprocess.Popen] = []
    try:
        _node(["--head", "--port", str(port), "--num-cpus", "1", "--include-dashboard", "false"], env, tmp_path, "head",
              procs)
        yield f"127.0.0.1:{port}", env, procs
    finally:
        _stop(procs)


#: the worker nodes: name and the fake accelerators each declares
WORKERS = (("w1", 2), ("w2", 4))
#: how the test finds the cluster's live nodes: waits (bounded) until all of them are seen
_NODES_PY = """import ray, json, time
ray.init(address='{addr}', logging_level='ERROR')
deadline = time.monotonic() + {wait_s}
while True:
    nodes = [n for n in ray.nodes() if n['Alive']]
    if len(nodes) == {want} or time.monotonic() > deadline: break
    time.sleep(0.5)
print('NODES=' + json.dumps([{{'id': n['NodeID'], 'acc': n['Resources'].get('fake_acc', 0)}} for n in nodes]))
"""


def _live_nodes(addr: str, env, want: int) -> list[dict]:
    out = _ray_py(_NODES_PY.format(addr=addr, wait_s=START_S, want=want), env)
    line = [x for x in out.splitlines() if x.startswith("NODES=")]
    assert line, out[-2000:]
    return json.loads(line[-1][len("NODES="):])


@pytest.fixture
def cluster(tmp_path, ray_head):
    """The head and two worker nodes declaring fake accelerators: (address, nodes, env)."""
    addr, env, procs = ray_head

    def worker(name: str, acc: int) -> subprocess.Popen:
        # one node joining at a time is gentler on a 2-core machine
        _node(["--address", addr, "--num-cpus", "2", "--resources", json.dumps({"fake_acc": acc})], env, tmp_path,
              name, procs)
        return procs[-1]

    heads = len(procs)  # the head's own (it may have been started more than once)
    running = {name: worker(name, acc) for name, acc in WORKERS}
    for attempt in range(3):
        # every node said it started; the head may still be registering the last one: wait for it
        nodes = _live_nodes(addr, env, want=1 + len(WORKERS))
        if len(nodes) == 1 + len(WORKERS):
            break
        # a node that died after it started (a port another process took meanwhile) starts again
        dead = [(n, acc) for n, acc in WORKERS if running[n].poll() is not None]
        assert dead, (nodes, [p.poll() for p in procs], "every node runs but the head does not see them all")
        for name, acc in dead:
            running[name] = worker(f"{name}-again{attempt}", acc)
    assert len(nodes) == 1 + len(WORKERS), (nodes, [p.poll() for p in procs])
    try:
        yield addr, nodes, env
    finally:
        # the workers stop with their test; the head serves the module's next test
        _stop(procs[heads:])
        del procs[heads:]


def test_profiling_tasks_land_only_on_nodes_with_the_resources(tmp_path, cluster):
    addr, nodes, env = cluster
    # the delay is slept per runner call, about seven per unit: some two units' tasks overlap
    space = write_space(tmp_path, options="wall_delay_s = 0.3",
                        extra='[hosts]\nresources = { fake_acc = "tp" }\n').read_text()
    space = space.replace("tp = [1, 2]", "tp = [1, 2, 4]").replace("heads = 16\nkv_heads = 8", "heads = 16\nkv_heads = 4")
    (tmp_path / "space.toml").write_text(space)
    cache = tmp_path / "cache.sqlite"
    r = subprocess.run([sys.executable, "-m", "search.cli", "run", str(tmp_path / "space.toml"), "--ray-address", addr,
                        "--profile-all", "--no-confirm", "--trials", "20", "--cache", str(cache),
                        "--results", str(tmp_path / "res"), "--name", "multi", "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((tmp_path / "res" / "multi" / "run.json").read_text())
    tasks = info["unit_tasks"]
    acc = {n["id"]: n["acc"] for n in nodes}
    # 3 tp x 2 batch units, each profiled by exactly one task
    assert sorted((t["tp"], t["batch"]) for t in tasks) == sorted((tp, b) for tp in (1, 2, 4) for b in (1, 4))
    for t in tasks:
        assert acc[t["node_id"]] >= t["tp"], t  # never on a node without the resources its tp needs
    assert {t["node_id"] for t in tasks if t["tp"] == 4} == {n for n, a in acc.items() if a == 4}
    assert len({t["node_id"] for t in tasks}) == 2  # both workers were used, the head (no fake_acc) never
    # tasks ran in parallel: some two of them overlapped in time
    spans = sorted((t["started_at"], t["ended_at"]) for t in tasks)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    # the cache holds every unit exactly once
    from store import ProfileCache

    with ProfileCache.open(cache) as c:
        units = c.units()
    assert len(units) == 6 and not units.duplicated(["fingerprint", "tp", "batch"]).any()
    assert (units["n_buckets"] == 4).all()


def test_a_run_without_the_clusters_token_is_one_line_exit_2_and_writes_nothing(tmp_path, ray_head):
    """The README's promise for a token-authenticated cluster joined without the token."""
    addr, env, _ = ray_head
    space = write_space(tmp_path)
    home = tmp_path / "home"  # no ~/.ray/auth_token to fall back on
    home.mkdir()
    bare = {k: v for k, v in env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")}
    r = subprocess.run([sys.executable, "-m", "search.cli", "run", str(space), "--ray-address", addr,
                        "--results", str(tmp_path / "res"), "--cache", str(tmp_path / "c.sqlite"), "--no-progress"],
                       capture_output=True, text=True, env={**bare, "HOME": str(home)}, timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "wants a token" in lines[0] and "RAY_AUTH_MODE" in lines[0] and "RAY_AUTH_TOKEN_PATH" in lines[0]
    assert not (tmp_path / "res").exists() and not (tmp_path / "c.sqlite").exists()
