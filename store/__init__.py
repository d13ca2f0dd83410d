"""The profile cache: bucket profiles of units in one SQLite file, shared by processes and hosts.

The IO beside the pure estimator (``lens``): SQLite storage, claims with leases, CSV and
Parquet export/import, salvage of a damaged file. One module per concern:

- ``schema``: the application id, schema version, tables and columns;
- ``opening``: where the file is, recognising it, creating and opening it;
- ``rows``: the checks of stored values, conversion to and from ``BucketProfile``;
- ``storage``: :class:`ProfileCache`, reading and writing units and profiles;
- ``claims``: claims on units being profiled, their leases and owners;
- ``failures``: units whose profiling failed for good, remembered so no search retries them;
- ``transfer``: CSV/Parquet export and import files;
- ``recovery``: :func:`recover`, the salvage of a damaged cache.
"""
from __future__ import annotations

from .claims import Claim, claimant_alive, new_claimant_id
from .failures import UnitFailure
from .opening import ENV_VAR, default_cache_path, resolve_cache_path
from .recovery import recover
from .schema import APPLICATION_ID, PROFILE_COLUMNS, SCHEMA_VERSION
from .storage import ProfileCache
from .transfer import EXPORT_FORMATS

__all__ = [
    "APPLICATION_ID",
    "Claim",
    "ENV_VAR",
    "EXPORT_FORMATS",
    "PROFILE_COLUMNS",
    "ProfileCache",
    "SCHEMA_VERSION",
    "UnitFailure",
    "claimant_alive",
    "default_cache_path",
    "new_claimant_id",
    "recover",
    "resolve_cache_path",
]
