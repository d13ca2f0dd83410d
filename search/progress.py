"""Progress bars on the terminal (tqdm, imported only when a bar is shown)."""
from __future__ import annotations

from typing import Any


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def clear(self) -> None:
        pass


def bar(total: int, desc: str, enabled: bool, initial: int = 0) -> Any:
    """A bar of ``total`` steps, or one that shows nothing when ``enabled`` is false."""
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, initial=initial, leave=False, dynamic_ncols=True)
