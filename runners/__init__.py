"""Runner registry: name -> "module:Class", imported only when chosen.

Heavy SDKs (jax, vllm, torch-neuronx) are imported inside their backend module, so
``import runners`` stays cheap and works with none of them installed.
"""
from __future__ import annotations

import importlib

from lens.errors import RunnerUnavailable, UserError
from lens.types import Target

from .base import Runner

#: name -> (module, class, pip extra that provides its SDK or None)
REGISTRY: dict[str, tuple[str, str, str | None]] = {
    "command": ("runners.command", "CommandRunner", None),
    "jax": ("runners.jax_runner", "JaxRunner", None),
    "sim": ("runners.sim", "SimRunner", None),
    "vllm": ("runners.vllm_runner", "VllmRunner", "vllm"),
    "neuron": ("runners.neuron", "NeuronRunner", "neuron"),
}


def available() -> list[str]:
    return sorted(REGISTRY)


def runner_class(name: str) -> type[Runner]:
    if name not in REGISTRY:
        raise UserError(f"unknown runner {name!r}: choose one of {', '.join(available())}")
    module, cls, extra = REGISTRY[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # the backend's SDK is an optional extra
        hint = f'pip install "lensopt[{extra}]"' if extra else "reinstall lensopt"
        raise RunnerUnavailable(f"runner {name!r} needs a package that is not installed ({exc.name or exc}): {hint}") from exc
    return getattr(mod, cls)


def get_runner(target: Target) -> Runner:
    """The runner named by ``target.runner``, constructed for that target."""
    return runner_class(target.runner)(target)


__all__ = ["REGISTRY", "Runner", "available", "get_runner", "runner_class"]
