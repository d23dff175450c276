"""How every script reads its arguments: jsonargparse, as `train.py` does, each argument with its help line.

`--help` shows the script's docstring as written (its usage lines kept), then each option with its type and default.
Imports neither torch nor Lightning, for a script that runs without them.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable
from typing import NoReturn

from jsonargparse import ArgumentParser, DefaultHelpFormatter, Namespace


class HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help (types, defaults), with the description's line breaks kept."""


class ScriptParser(ArgumentParser):
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """The reason in one line, as train.py gives it, instead of the usage above it."""
        if not self.exit_on_error:  # a caller that handles the error itself
            super().error(message, ex)
        message = " ".join(message.split())
        sys.stderr.write(f"error: {message}\n{did_you_mean(message, self)}`{self.prog} --help` lists the options.\n")
        self.exit(2)


def nearest_options(message: str, parser: ArgumentParser, also: Iterable[str] = ()) -> list[str]:
    """The options of `parser` (and `also`) nearest to those an "unrecognized arguments" `message` names."""
    unknown = re.search(r"unrecognized arguments: (.*)", message)
    words = [w.partition("=")[0] for w in unknown.group(1).split() if w.startswith("--")] if unknown else []
    options = [*parser._option_string_actions, *also]
    return [m for w in words for m in difflib.get_close_matches(w, options, n=1)]


def did_you_mean(message: str, parser: ArgumentParser, also: Iterable[str] = ()) -> str:
    """A line naming the nearest options (`nearest_options`), or "": for a script's own options, and, with `also`
    train.py's, for a typo in one that `parse_known` passed on to train.py."""
    near = nearest_options(message, parser, also)
    return f"did you mean {' / '.join(near)}?\n" if near else ""


def script_parser(doc: str | None) -> ArgumentParser:
    """The parser of a script whose module docstring is `doc`. Options are spelled in full (jsonargparse's coming
    default): `parse_known` knows a script's own options by their names."""
    return ScriptParser(description=doc, formatter_class=HelpFormatter, allow_abbrev=False)


def parse_known(parser: ArgumentParser, argv: list[str]) -> tuple[Namespace, list[str]]:
    """(the script's own options, parsed; the other flags): for a script that passes every flag it does not know on
    to `train.py fit`, whose parser checks them (jsonargparse has no `parse_known_args`, so that no typo is silently
    dropped). A value goes with the option before it."""
    own_names = set(parser._option_string_actions)  # every spelling of the parser's options, -h included
    own: list[str] = []
    rest: list[str] = []
    to = own
    for arg in argv:
        if arg.startswith("-") and not _is_number(arg):
            to = own if arg.partition("=")[0] in own_names else rest
        to.append(arg)
    return parser.parse_args(own), rest


def option_values(argv: list[str], option: str) -> list[str]:
    """The values `argv` gives `option` (`--config a.yaml`, `--config=b.yaml`), in their order: the last one wins."""
    values = []
    for arg, after in zip(argv, [*argv[1:], None], strict=True):
        if arg == option and after is not None:
            values.append(after)
        elif arg.startswith(f"{option}="):
            values.append(arg.partition("=")[2])
    return values


def _is_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True
