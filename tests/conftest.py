"""What every test shares: a default profile cache of its own.

A command run without ``--cache`` opens ``$LENSOPT_CACHE`` or ``~/.cache/lensopt/profiles.sqlite``
(``store.default_cache_path``). Each test gets a fresh, empty one, so that no test reads or writes the
user's cache, and none depends on what an earlier run left there (a cache written by a newer lensopt
is refused, one with units in it would be reused). Tests of the default path itself set or unset the
variable as they need.
"""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_default_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("LENSOPT_CACHE", str(tmp_path_factory.mktemp("default-cache") / "profiles.sqlite"))
