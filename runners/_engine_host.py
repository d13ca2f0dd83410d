"""An engine in a child process of its own: closing it ends the process, which frees the device.

NxD Inference and vLLM hold NeuronCores (and GPU memory) through runtimes that are set
up once per process; nothing shows that they hand the cores back when one compiled unit
is dropped and a unit of another tp is loaded in the same process.  So a runner that sets
``EngineRunner.one_unit_per_process`` starts each engine through :class:`EngineProcess`:
the engine class is imported and constructed in a fresh interpreter, every call goes over
a socket, and ``close`` ends that interpreter.  The parent never imports the SDK.

The same holds on every path that runs a unit (a Ray task, ``lensopt profile`` in the
foreground), with nothing for the caller to do.  The child leaves when its parent does:
it exits at the end of its socket, and a watchdog thread ends it when it is re-parented
(a parent killed mid-compile never answers again).

Protocol: length-prefixed JSON (nothing is ever unpickled).  The parent sends
``{"op": "start", "engine": "module:qualname", "spec": ...}``, then ``{"op": "call",
"method": ..., "args": [...]}`` any number of times, then ``{"op": "close"}``; the child
answers each with ``{"ok": value}`` or ``{"error": {"type", "message", "traceback"}}``.
Values are JSON with tagged dataclasses (of the ``lens`` and ``runners`` packages only),
tuples and numpy arrays, so specs and ``TimedBatch`` results travel as they are.
"""
from __future__ import annotations

import builtins
import dataclasses
import importlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np

from lens import errors as lens_errors
from lens.errors import LensoptError, RunnerError

#: attributes of a started engine the runner reads (compile and load seconds, reuse)
ENGINE_ATTRS = ("compile_s", "load_s", "reused_artifacts", "artifacts")

#: seconds a closing engine gets to end its process before it is killed
CLOSE_TIMEOUT_S = 120.0

#: packages whose dataclasses may be rebuilt from a message
_TRUSTED = ("lens.", "runners.")


# -- values as JSON ----------------------------------------------------------------------------


def encode(v: Any) -> Any:
    """A JSON-able form of ``v`` (tagged dataclasses, tuples, numpy arrays and scalars)."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        cls = type(v)
        return {"$dc": f"{cls.__module__}:{cls.__qualname__}",
                "v": {f.name: encode(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if isinstance(v, np.ndarray):
        return {"$nd": v.tolist(), "dtype": str(v.dtype)}
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, tuple):
        return {"$t": [encode(x) for x in v]}
    if isinstance(v, list):
        return [encode(x) for x in v]
    if isinstance(v, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in v):
            return {k: encode(x) for k, x in v.items()}
        return {"$m": [[encode(k), encode(x)] for k, x in v.items()]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"cannot send a {type(v).__name__} to or from an engine process")


def _resolve(name: str) -> Any:
    """The object ``module:qualname`` names."""
    module, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _dataclass(name: str) -> type:
    if not name.startswith(_TRUSTED):
        raise ValueError(f"an engine message names {name}, outside the lens and runners packages")
    obj = _resolve(name)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise ValueError(f"an engine message names {name}, which is not a dataclass")
    return obj


def decode(v: Any) -> Any:
    """The value ``encode`` made ``v`` from."""
    if isinstance(v, list):
        return [decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "$dc" in v:
        return _dataclass(v["$dc"])(**{k: decode(x) for k, x in v["v"].items()})
    if "$nd" in v:
        return np.asarray(v["$nd"], dtype=v["dtype"])
    if "$t" in v:
        return tuple(decode(x) for x in v["$t"])
    if "$m" in v:
        return {decode(k): decode(x) for k, x in v["$m"]}
    return {k: decode(x) for k, x in v.items()}


def _send(sock: socket.socket, msg: Any) -> None:
    data = json.dumps(msg).encode()
    sock.sendall(struct.pack("<Q", len(data)) + data)


def _recv(sock: socket.socket) -> Any:
    def exactly(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("the other end of the engine socket closed")
            buf += chunk
        return bytes(buf)

    (n,) = struct.unpack("<Q", exactly(8))
    return json.loads(exactly(n))


def _error(exc: BaseException) -> dict:
    return {"error": {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}}


def _rebuild(err: dict) -> BaseException:
    """The child's exception as the parent raises it: lensopt's and built-in ones by type."""
    name, msg = err["type"], err["message"]
    cls = getattr(lens_errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, LensoptError)):
        cls = getattr(builtins, name, None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            return RuntimeError(f"{name}: {msg}")
    try:
        return cls(msg)
    except TypeError:  # an exception whose constructor wants more than a message
        return RuntimeError(f"{name}: {msg}")


# -- the parent's side -----------------------------------------------------------------------------


class EngineProcess:
    """``engine_class(spec)`` constructed and driven in a child interpreter (see the module docstring)."""

    def __init__(self, engine_class: type, spec: Any):
        self.engine_name = f"{engine_class.__module__}:{engine_class.__qualname__}"
        parent, child = socket.socketpair()
        env = dict(os.environ)
        # the child imports what the parent imports (the project, and in tests their fakes)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runners._engine_host", str(child.fileno())],
                pass_fds=(child.fileno(),), env=env, close_fds=True,
            )
        finally:
            child.close()
        self.pid = self.proc.pid
        self._sock: socket.socket | None = parent
        try:
            info = self._ask({"op": "start", "engine": self.engine_name, "spec": encode(spec)})
        except BaseException:
            self._drop()  # the child leaves after a failed start: collect it
            raise
        for k in ENGINE_ATTRS:
            if k in info:
                setattr(self, k, info[k])

    def _ask(self, msg: dict) -> Any:
        if self._sock is None:
            raise RunnerError(f"the engine process {self.pid} ({self.engine_name}) is closed")
        try:
            _send(self._sock, msg)
            reply = _recv(self._sock)
        except (EOFError, OSError) as exc:
            rc = self.proc.poll()
            self._drop()
            raise RunnerError(
                f"the engine process {self.pid} ({self.engine_name}) ended without answering "
                f"(exit code {rc}): {type(exc).__name__}"
            ) from exc
        if "ok" in reply:
            return decode(reply["ok"])
        exc = _rebuild(reply["error"])
        exc.add_note(f"in the engine process {self.pid}:\n{reply['error']['traceback']}")
        raise exc

    def generate_timed(self, prompts, output_lens):
        return self._ask({"op": "call", "method": "generate_timed",
                          "args": [[[int(x) for x in p] for p in prompts], [int(n) for n in output_lens]]})

    def serve_timed(self, prompts, output_lens, arrival_s):
        return self._ask({"op": "call", "method": "serve_timed",
                          "args": [[[int(x) for x in p] for p in prompts], [int(n) for n in output_lens],
                                   [float(a) for a in arrival_s]]})

    def close(self) -> None:
        if self._sock is None:
            return
        try:
            self._ask({"op": "close"})
        finally:
            self._drop()

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()  # the child sees the end of its socket and leaves
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


# -- the child ---------------------------------------------------------------------------------


def _leave_with_parent(parent_pid: int, period_s: float = 1.0) -> None:
    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)  # the parent is gone: free the device now, not after a long compile
            time.sleep(period_s)

    threading.Thread(target=watch, name="lensopt-parent-watch", daemon=True).start()


def serve(fd: int) -> int:
    """Run one engine for the parent at the other end of socket ``fd``."""
    _leave_with_parent(os.getppid())
    sock = socket.socket(fileno=fd)
    engine = None
    while True:
        try:
            msg = _recv(sock)
        except EOFError:
            break
        op = msg.get("op")
        try:
            if op == "start":
                engine = _resolve(msg["engine"])(decode(msg["spec"]))
                reply = {k: getattr(engine, k) for k in ENGINE_ATTRS if hasattr(engine, k)}
                _send(sock, {"ok": encode(reply)})
            elif op == "call":
                _send(sock, {"ok": encode(getattr(engine, msg["method"])(*decode(msg["args"])))})
            elif op == "close":
                if engine is not None:
                    engine.close()
                _send(sock, {"ok": None})
                break
            else:
                raise ValueError(f"unknown engine message {op!r}")
        except Exception as exc:  # every failure goes back to the parent, which raises it
            _send(sock, _error(exc))
            if op == "start":
                break
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
