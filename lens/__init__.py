"""LENS, the estimator: two end-to-end runs per bucket predict the latency of any request.

Pure numpy: no SQLite, no Ray, no hardware (the profile cache is the ``store`` package,
the backends are ``runners``). The names below are the library's entry points; the
modules hold the rest (``lens.buckets``, ``lens.distributions``, ``lens.amali``, ...).
"""
from __future__ import annotations

from .buckets import auto_buckets
from .capacity import RateSearch, max_sustainable_rate
from .compose import Prediction, UnitTable, predict
from .errors import (
    CacheError,
    DeviceOutOfMemory,
    LensoptError,
    MissingProfiles,
    RunnerError,
    RunnerUnavailable,
    SpaceError,
    TraceError,
    UnitCannotRun,
    UnitRefused,
    UserError,
)
from .metrics import summarize, summarize_prediction
from .probes import NoisyMeasurement, plan_probes, solve
from .serving import ServingPrediction, predict_serving
from .serving_metrics import RequestSLO, summarize_serving, summarize_serving_prediction
from .types import (
    BucketProfile,
    Candidate,
    ModelShape,
    Probe,
    ProbeRun,
    ProfileResult,
    Requests,
    Scheduler,
    Target,
    Unit,
    WorkloadRun,
)
from .workload import fit_to, load_workload, read_trace

__all__ = [
    # values
    "BucketProfile", "Candidate", "ModelShape", "Probe", "ProbeRun", "ProfileResult", "Requests", "Target",
    "Unit", "WorkloadRun",
    # measuring and predicting
    "auto_buckets", "plan_probes", "solve", "UnitTable", "Prediction", "predict", "summarize",
    "summarize_prediction",
    # serving with arrivals (continuous batching)
    "Scheduler", "ServingPrediction", "predict_serving", "RequestSLO", "summarize_serving",
    "summarize_serving_prediction", "RateSearch", "max_sustainable_rate",
    # workloads
    "load_workload", "read_trace", "fit_to",
    # errors
    "LensoptError", "UserError", "SpaceError", "TraceError", "CacheError", "MissingProfiles", "RunnerError",
    "UnitCannotRun", "DeviceOutOfMemory", "UnitRefused", "RunnerUnavailable", "NoisyMeasurement",
]
