"""How every script reads its arguments: jsonargparse, as `train.py` does, each argument with its help line.

`--help` shows the script's docstring as written (its usage lines kept), then each option with its type and default.
Imports neither torch nor Lightning, for a script that runs without them.
"""

from __future__ import annotations

import argparse

from jsonargparse import ArgumentParser, DefaultHelpFormatter


class HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help (types, defaults), with the description's line breaks kept."""


def script_parser(doc: str | None) -> ArgumentParser:
    """The parser of a script whose module docstring is `doc`."""
    return ArgumentParser(description=doc, formatter_class=HelpFormatter)


def split_flags(parser: ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """(the script's own options, the rest): `argv` split for a script that passes every flag it does not know on to
    `train.py fit` (jsonargparse parses only what it knows, so that no typo is silently dropped; the rest is
    checked by train.py's parser). A value goes with the option before it."""
    own_names = set(parser._option_string_actions)  # every spelling of the parser's options, -h included
    own: list[str] = []
    rest: list[str] = []
    to = own
    for arg in argv:
        if arg.startswith("-") and not _is_number(arg):
            to = own if arg.partition("=")[0] in own_names else rest
        to.append(arg)
    return own, rest


def _is_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True
