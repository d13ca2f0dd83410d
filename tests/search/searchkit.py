"""The search tests' kit: the simulated space file they share.

(A module of its own rather than conftest.py: pytest loads every folder's conftest.py under
one module name, so `from conftest import` reads whichever folder's came last.)
"""
import textwrap

from spacekit import sim_space

SIM_SPACE = sim_space(name="sim-small", requests=60, trials=40, top_k=2)


def write_space(tmp_path, name="space.toml", options="", extra=""):
    p = tmp_path / name
    p.write_text(SIM_SPACE.format(options=options, extra=textwrap.dedent(extra)))
    return p
