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

Protocol (``multiprocessing.connection`` messages, pickled): the parent sends
``("start", module, qualname, spec)``, then ``("call", method, args)`` any number of
times, then ``("close",)``; the child answers each with ``("ok", value)`` or
``("error", exception-or-text, traceback text)``.
"""
from __future__ import annotations

import importlib
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from lens.errors import RunnerError

#: attributes of a started engine the runner reads (compile and load seconds, reuse)
ENGINE_ATTRS = ("compile_s", "load_s", "reused_artifacts", "artifacts")

#: seconds a closing engine gets to end its process before it is killed
CLOSE_TIMEOUT_S = 120.0


class EngineProcess:
    """``engine_class(spec)`` constructed and driven in a child interpreter (see the module docstring)."""

    def __init__(self, engine_class: type, spec: Any):
        self.engine_name = f"{engine_class.__module__}.{engine_class.__qualname__}"
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
        self._conn: Connection | None = Connection(parent.detach())
        try:
            info = self._ask(("start", engine_class.__module__, engine_class.__qualname__, spec))
        except BaseException:
            self._drop()  # the child leaves after a failed start: collect it
            raise
        for k in ENGINE_ATTRS:
            if k in info:
                setattr(self, k, info[k])

    def _ask(self, msg: tuple) -> Any:
        if self._conn is None:
            raise RunnerError(f"the engine process {self.pid} ({self.engine_name}) is closed")
        try:
            self._conn.send(msg)
            kind, *rest = self._conn.recv()
        except (EOFError, OSError) as exc:
            rc = self.proc.poll()
            self._drop()
            raise RunnerError(
                f"the engine process {self.pid} ({self.engine_name}) ended without answering "
                f"(exit code {rc}): {type(exc).__name__}"
            ) from exc
        if kind == "ok":
            return rest[0]
        err, tb = rest
        if isinstance(err, BaseException):
            err.add_note(f"in the engine process {self.pid}:\n{tb}")
            raise err
        raise RuntimeError(f"{err} (in the engine process {self.pid})")

    def generate_timed(self, prompts, output_lens):
        return self._ask(("call", "generate_timed", ([list(map(int, p)) for p in prompts], [int(n) for n in output_lens])))

    def close(self) -> None:
        if self._conn is None:
            return
        try:
            self._ask(("close",))
        finally:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()  # the child sees the end of its socket and leaves
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


def _error(exc: BaseException) -> tuple:
    tb = traceback.format_exc()
    try:
        pickle.loads(pickle.dumps(exc))
        return ("error", exc, tb)
    except Exception:  # an SDK exception that does not travel: send its text
        return ("error", f"{type(exc).__name__}: {exc}", tb)


def serve(fd: int) -> int:
    """Run one engine for the parent at the other end of socket ``fd``."""
    _leave_with_parent(os.getppid())
    conn = Connection(fd)
    engine = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        kind = msg[0]
        try:
            if kind == "start":
                _, module, qualname, spec = msg
                cls: Any = importlib.import_module(module)
                for part in qualname.split("."):
                    cls = getattr(cls, part)
                engine = cls(spec)
                reply = {k: getattr(engine, k) for k in ENGINE_ATTRS if hasattr(engine, k)}
                reply["pid"] = os.getpid()
                conn.send(("ok", reply))
            elif kind == "call":
                _, method, args = msg
                conn.send(("ok", getattr(engine, method)(*args)))
            elif kind == "close":
                if engine is not None:
                    engine.close()
                conn.send(("ok", None))
                break
            else:
                conn.send(("error", f"unknown message {kind!r}", ""))
        except Exception as exc:  # every failure goes back to the parent, which raises it
            conn.send(_error(exc))
            if kind == "start":
                break
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
