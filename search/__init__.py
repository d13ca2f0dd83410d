"""The search: Optuna over tp x batch x bucket sets on LENS predictions, with Ray profiling
the units missing from the profile cache and confirming the best candidates.

Importing it loads neither Optuna nor Ray (the functions that search import them), so the
``lensopt`` commands that do not search run without them.
"""
from .confirm import Confirmation
from .estimate import estimate_run
from .evaluate import Evaluation
from .ledger import RunLedger
from .results import ResultsError, SearchResult
from .run import confirm_run, run
from .study import SAMPLERS

__all__ = ["Confirmation", "Evaluation", "ResultsError", "RunLedger", "SAMPLERS", "SearchResult", "confirm_run",
           "estimate_run", "run"]
