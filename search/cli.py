"""The ``lensopt`` command line.

Each subcommand lives in a ``search/cmd_*.py`` module exposing
``register(sub: argparse._SubParsersAction) -> None``; the subparser it adds sets
``func=handler`` where ``handler(args) -> int`` returns the exit code. Handlers raise
``LensoptError`` for expected failures: ``main`` prints them on one line and exits with
the error's code (2 for user mistakes), never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from lens.errors import LensoptError

#: subcommand modules, in the order ``lensopt --help`` lists them
COMMAND_MODULES = [
    "search.cmd_run",
    "search.cmd_profile",
    "search.cmd_cache",
    "search.cmd_amali",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line, exit 2
        self.print_usage(sys.stderr)
        self.exit(2, f"lensopt: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lensopt",
        description="Find the best deployment of an LLM on a compiled-shape accelerator (LENS latency prediction).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LensoptError as exc:
        print(f"lensopt: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("lensopt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
