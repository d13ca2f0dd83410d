"""The runner interface: three methods every backend implements.

A runner is constructed from a ``Target`` (no I/O in the constructor) and then:

- ``fingerprint()``: a stable hash of everything that changes a measurement
  (runner, device kind, SDK/compiler versions, model architecture, dtype, policy);
- ``profile(unit, probes)``: compiles the unit once for the probes' buckets and runs each
  probe (a full batch of identical requests, ``probe.repeats`` times), returning raw times;
  the repeats are taken round-robin over the probes (every probe once, then every probe
  again, ...), so a slow minute of the host spreads over all buckets instead of biasing one;
- ``run_workload(candidate, requests, *, mode="static")``: runs real requests on the
  candidate's bucket sets, returning per-request TTFT and E2E: in static batches of
  ``candidate.batch`` (``mode="static"``, every runner), or served by continuous batching
  with the requests released at their arrival times (``mode="continuous"``, the machine of
  docs/serving.md, for runners that list it in ``modes``).

Hooks with defaults: ``modes`` (the serving modes it runs), ``batchings`` (the
``[target] batching`` it executes: static batches only, unless a backend runs ragged
ones), ``fingerprint_fields`` (what goes into the fingerprint), ``close``.
"""
from __future__ import annotations

import platform
import socket
from abc import ABC, abstractmethod
from typing import Any, Sequence

from lens.errors import UserError
from lens.types import Candidate, Probe, ProfileResult, Requests, Target, Unit, WorkloadRun, stable_hash

#: every serving mode a runner may support (docs/serving.md)
MODES = ("static", "continuous")


class Runner(ABC):
    """Base class of every backend; see the module docstring."""

    #: registry name, e.g. "jax"
    name: str = ""
    #: True for backends whose numbers are simulated, never measured on hardware
    simulated: bool = False
    #: accepted ``[target.options]`` keys -> (type, default); unknown keys are an error
    options_schema: dict[str, tuple[type, Any]] = {}
    #: ``[target.options]`` keys that became settings elsewhere -> what to write instead; the
    #: loader says so instead of calling them unknown
    moved_options: dict[str, str] = {}
    #: serving modes this backend runs: static batches always; "continuous" when it implements it
    modes: tuple[str, ...] = ("static",)
    #: ``[target] batching`` values this backend executes. A search predicts with the target's
    #: batching and confirms on the runner: a runner that ran static batches for a ragged target
    #: would compare ragged predictions with static measurements, so it refuses the target.
    batchings: tuple[str, ...] = ("static",)

    def __init__(self, target: Target):
        self.target = target
        why = self.refuses_batching(target)
        if why:
            raise UserError(why)

    @classmethod
    def refuses_batching(cls, target: Target) -> str | None:
        """Why this backend cannot execute ``target.batching`` (None when it can)."""
        if target.batching in cls.batchings:
            return None
        return (f"target.batching = {target.batching!r}: runner {cls.name!r} executes {' and '.join(cls.batchings)} "
                f"batches only, so its measurements would not be of the machine the predictions model; set "
                f"batching = \"static\" (`lensopt predict --mode {target.batching}` still predicts it from the profiles)")

    # -- the three required methods -------------------------------------------------------
    def fingerprint(self) -> str:
        return stable_hash(self.fingerprint_fields())

    @abstractmethod
    def profile(self, unit: Unit, probes: Sequence[Probe]) -> ProfileResult:
        """Compile ``unit`` for the probes' buckets once, run every probe, return raw times."""

    @abstractmethod
    def run_workload(self, candidate: Candidate, requests: Requests, *, mode: str = "static") -> WorkloadRun:
        """Run ``requests``: in order in static batches of ``candidate.batch``, or (``mode="continuous"``)
        served by continuous batching from their ``arrival_s``, TTFT and E2E counted from each arrival."""

    # -- hooks ----------------------------------------------------------------------------
    def check_mode(self, mode: str, requests: Requests | None = None) -> None:
        """``UserError`` unless this runner runs ``mode`` (and, continuous, ``requests`` carry arrivals)."""
        if mode not in MODES:
            raise UserError(f"serving mode {mode!r} is unknown: use one of {', '.join(MODES)}")
        if mode == "static":  # every runner runs static batches (asking ``modes`` may start a program)
            return
        if mode not in self.modes:
            raise UserError(
                f"runner {self.name!r} ({self.target.name}) does not run {mode} mode; it runs "
                f"{', '.join(self.modes)} (docs/serving.md says what a runner must do to serve it)"
            )
        if mode == "continuous" and requests is not None and requests.arrival_s is None:
            raise UserError("continuous mode needs arrival times: give an arrival rate or a trace with arrivals")

    def fingerprint_fields(self) -> dict[str, Any]:
        """Everything that changes a measurement. Runners add their SDK versions."""
        t = self.target
        return {
            "runner": self.name,
            "hardware": t.hardware,
            "dtype": t.dtype,
            "policy": t.bucket_policy,
            "model": t.model.to_dict(),
            "versions": self.versions(),
            # a batched target's TTFT_b is one call of the whole batch, a sequential one's one
            # request's prefill (lens.probes): the two never share profiles. Sequential is left
            # out so a target keeps the fingerprint it had before the setting existed.
            **({"prefill": t.prefill} if t.prefill != "sequential" else {}),
        }

    def versions(self) -> dict[str, str]:
        """SDK / compiler versions that go into the fingerprint and the provenance."""
        return {"python": platform.python_version()}

    def check_unit(self, unit: Unit) -> None:
        """Raise ``UserError`` when the unit cannot run on this target (e.g. tp vs heads)."""

    def deploy_snippets(self, candidate: Candidate) -> dict[str, str]:
        """Files that deploy ``candidate`` the way this backend takes it (name -> text).

        The default is the configuration as JSON; backends add their own forms (a pinned
        space file, a ``vllm serve`` command line, an NxD Inference ``neuron_config``).
        """
        import json

        cfg = {
            "target": self.target.name,
            "runner": self.name,
            "hardware": self.target.hardware,
            "tp": candidate.tp,
            "batch_size": candidate.batch,
            "bucket_policy": self.target.bucket_policy,
            "context_encoding_buckets": list(candidate.ctx_buckets),
            "token_generation_buckets": list(candidate.tkg_buckets),
            "max_length": max(candidate.tkg_buckets),
        }
        return {"config.json": json.dumps(cfg, indent=2) + "\n"}

    def close(self) -> None:
        """Release devices or processes held by the runner."""

    @staticmethod
    def host() -> str:
        return socket.gethostname()
