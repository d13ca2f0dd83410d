"""``python -m runners.sim``: the sim runner's ``[target.options]``, read from their one declaration."""
from __future__ import annotations

from .options import EFFECTS, OPTIONS_SCHEMA, describe


def main() -> int:
    width = max(map(len, OPTIONS_SCHEMA))
    print("[target.options] of runner \"sim\" (every number it returns is simulated)")
    for name, (typ, default) in OPTIONS_SCHEMA.items():
        value = str(default).lower() if typ is bool else repr(default) if typ is str else default
        tag = "  effect" if name in EFFECTS else ""
        print(f"  {name:<{width}}  {typ.__name__:<5}  default {value!s:<12}{tag}".rstrip())
        print(f"  {'':<{width}}  {describe(name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
