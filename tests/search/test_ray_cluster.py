"""A real multi-node Ray cluster on this machine: a head and two worker nodes (``ray start``)
declaring fake accelerator resources; profiling tasks must land only where their tp fits."""
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import write_space

RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
pytestmark = pytest.mark.skipif(RAY is None, reason="the ray command line is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_ports(k: int) -> list[str]:
    """Ports of its own for node k: several nodes on one host must not meet on Ray's fixed defaults."""
    out = []
    for flag in ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
                 "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port"):
        out += [flag, str(_free_port())]
    lo = 30000 + 1000 * k
    return out + ["--min-worker-port", str(lo), "--max-worker-port", str(lo + 999)]


def _start(args, env, k: int):
    # --block keeps `ray start` in the foreground; SIGTERM to it stops exactly the node it started
    return subprocess.Popen([RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
                             *_node_ports(k), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)


def _ray_py(code: str, env) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240, check=True).stdout


@pytest.fixture
def cluster(tmp_path):
    import ray

    if ray.is_initialized():  # a local Ray of an earlier test in this process: free its cores first
        ray.shutdown()
    port = _free_port()
    # token authentication, as a shared cluster should run: a token of this test's own
    token = tmp_path / "ray_token"
    token.write_text(secrets.token_hex(32))
    # a Ray started earlier in this test session exports RAY_ADDRESS: never inherit it
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env = {**base, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    procs = [_start(["--head", "--port", str(port), "--num-cpus", "1", "--include-dashboard", "false"], env, 0)]
    addr = f"127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:  # wait for the head before adding workers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError("the Ray head did not start")
                time.sleep(0.5)
        procs.append(_start(["--address", addr, "--num-cpus", "2", "--resources", json.dumps({"fake_acc": 2})], env, 1))
        time.sleep(5)  # one node joining at a time is gentler on a 2-core machine
        procs.append(_start(["--address", addr, "--num-cpus", "2", "--resources", json.dumps({"fake_acc": 4})], env, 2))
        code = ("import ray, json, time\n"
                f"ray.init(address='{addr}', logging_level='ERROR')\n"
                "for _ in range(360):\n"
                "    nodes = [n for n in ray.nodes() if n['Alive']]\n"
                "    if len(nodes) == 3: break\n"
                "    time.sleep(0.5)\n"
                "print('NODES=' + json.dumps([{'id': n['NodeID'], 'acc': n['Resources'].get('fake_acc', 0)} for n in nodes]))\n")
        out = _ray_py(code, env)
        line = [x for x in out.splitlines() if x.startswith("NODES=")]
        assert line, out[-2000:]
        nodes = json.loads(line[-1][len("NODES="):])
        assert len(nodes) == 3, nodes
        yield addr, nodes, env
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def test_profiling_tasks_land_only_on_nodes_with_the_resources(tmp_path, cluster):
    addr, nodes, env = cluster
    space = write_space(tmp_path, options="wall_delay_s = 2.0",
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
