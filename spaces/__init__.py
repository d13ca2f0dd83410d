"""Space files: what to deploy, where, and which configurations to search."""
from .loader import load_space, parse_space
from .schema import Budget, Hosts, Objectives, ProfileSettings, SearchSpace, Space, WorkloadSpec
from .workload import WorkloadDescription, load_requests, requests_again

__all__ = ["Budget", "Hosts", "Objectives", "ProfileSettings", "SearchSpace", "Space", "WorkloadDescription",
           "WorkloadSpec", "load_requests", "load_space", "parse_space", "requests_again"]
