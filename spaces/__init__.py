"""Space files: what to deploy, where, and which configurations to search."""
from .loader import load_space, parse_space
from .schema import Budget, Hosts, Objectives, ProfileSettings, SearchSpace, Space, WorkloadSpec

__all__ = ["Budget", "Hosts", "Objectives", "ProfileSettings", "SearchSpace", "Space", "WorkloadSpec", "load_space",
           "parse_space"]
