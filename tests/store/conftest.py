import pytest

from store import ProfileCache


@pytest.fixture
def cache(tmp_path):
    """A fresh cache in a directory that does not exist yet (opening creates it)."""
    with ProfileCache.open(tmp_path / "c" / "profiles.sqlite") as c:
        yield c
