"""The command's own kinds of values, checked at parse time so that a bad one
gets click's usage error (exit 2, one line); and the -x variables, sorted
into the two fields the configuration reads."""

from __future__ import annotations

import math
from typing import Any

import click

from jaxrun import contract, meshspec
from jaxrun.core.ranks import DIGITS, parse_ranks

# The longest wait any option may ask for (about 31 years).  Beyond it the
# event loop's waits overflow (threading.TIMEOUT_MAX is about 292 years).
MAX_SECONDS = 1e9


class Seconds(click.FloatRange):
    """A finite number of seconds.  FloatRange takes "nan" and "inf": every
    comparison with nan is false, so a nan deadline never fires and the loop
    spins, and an infinite one overflows the first wait."""

    name = "SECONDS"

    def convert(self, value, param, ctx):
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds) or seconds > MAX_SECONDS:
            self.fail(f"{value!r} is not a finite number of seconds up to {MAX_SECONDS:.0f}", param, ctx)
        return seconds


class ProfileWindow(click.ParamType):
    """--profile START:SECONDS: (start, seconds)."""

    name = "START:SECONDS"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        from jaxrun.launcher.attempt.profiling import parse_window

        try:
            return parse_window(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class OptionalCount(click.Option):
    """An option whose count may be left out: ``--flight-recorder`` or
    ``--flight-recorder 128``.  Click would take the script that follows a
    bare option for its count; this one takes the next word only when it is
    a whole number, and otherwise gives it back to the command line."""

    def add_to_parser(self, parser, ctx) -> None:
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            parsed = getattr(parser, "_long_opt", {}).get(name)
            if parsed is not None:
                parsed.process = self._giving_back(parsed.process)
        # A value given with "=" was meant for the option, never for the command
        # line: one it cannot take is an error (``--probe=bogus``), not a script.
        match = getattr(parser, "_match_long_opt", None)
        if match is not None:
            def match_long(opt, explicit_value, state):
                if opt in self.opts and explicit_value is not None and not self.takes(explicit_value):
                    raise click.BadOptionUsage(opt, f"{opt}={explicit_value}: {opt} takes {self.wants()}", ctx)
                return match(opt, explicit_value, state)

            parser._match_long_opt = match_long

    def takes(self, word: str) -> bool:
        return bool(DIGITS.match(word))

    def wants(self) -> str:
        return "a whole number or nothing"

    def _giving_back(self, process):
        def process_count(value, state):
            if isinstance(value, str) and not self.takes(value):
                state.rargs.insert(0, value)
                value = str(self.flag_value)
            process(value, state)

        return process_count


class OptionalWord(OptionalCount):
    """``--probe`` or ``--probe strict``: the next word is its value only
    when it is one of the option's choices."""

    def takes(self, word: str) -> bool:
        return word in self.type.choices

    def wants(self) -> str:
        return ", ".join(self.type.choices) + " or nothing"


class RankList(click.ParamType):
    """--console-ranks and ``jaxrun logs --ranks``: see ``core.ranks.parse_ranks``."""

    name = "RANKS"

    def convert(self, value, param, ctx):
        try:
            return parse_ranks(value)
        except ValueError:
            self.fail(f"{value!r} is not a list of ranks like 0 or 0,2-3 (or all, or none)", param, ctx)


class HostPort(click.ParamType):
    name = "HOST:PORT"

    def convert(self, value, param, ctx):
        host, sep, port = str(value).rpartition(":")
        if not sep or not host or not DIGITS.match(port) or not 0 < int(port) < 65536:
            self.fail(f"{value!r} is not HOST:PORT with a port between 1 and 65535", param, ctx)
        return f"{host}:{int(port)}"


class KeyValue(click.ParamType):
    name = "KEY=VALUE"

    def convert(self, value, param, ctx):
        try:
            return contract.parse_env_pair(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Variable(click.ParamType):
    """-x, as mpirun spells it: ``KEY=VALUE`` sets KEY, a bare ``KEY``
    forwards jaxrun's own value of it.  The value is ``(KEY, VALUE)``, or
    ``(KEY, None)`` to forward."""

    name = "KEY[=VALUE]"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        text = str(value)
        forward = "=" not in text
        try:  # the contract's one rule for a variable's name
            key, given = contract.parse_env_pair(text + "=" if forward else text)
        except ValueError:
            self.fail(f"{text!r} is not KEY=VALUE or KEY, with KEY a variable name "
                      "(letters, digits and _, not starting with a digit)", param, ctx)
        return (key, None) if forward else (key, given)


def sort_variables(params: dict[str, Any]) -> None:
    """Move -x's variables (``params["variables"]``) to where the
    configuration reads them whatever the spelling: the pairs to set join
    ``env_pairs`` (--env's), the names to forward join ``exports``
    (--export's)."""
    given = params.pop("variables", None) or ()
    params["env_pairs"] = (*params.get("env_pairs", ()), *((k, v) for k, v in given if v is not None))
    params["exports"] = (*params.get("exports", ()), *(k for k, v in given if v is None))


# The spellings that go away in the next version, and what replaces each.
DEPRECATED = {"--env": "-x KEY=VALUE", "--export": "-x KEY"}


def deprecated(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Say once per run, whatever the number of uses, that a spelling goes
    away; it still works."""
    if value and not ctx.resilient_parsing:
        (old,) = (name for name in param.opts if name in DEPRECATED)
        click.echo(f"jaxrun: {old} is now {DEPRECATED[old]}; {old} goes away in the next version", err=True)
    return value


class MeshSpecType(click.ParamType):
    """Checks --mesh syntax at parse time; the device count is checked in the children."""

    name = "SPEC"

    def convert(self, value, param, ctx):
        try:
            spec = meshspec.parse(str(value))
        except meshspec.MeshSpecError as e:
            self.fail(str(e), param, ctx)
        # Children parse the text again; pass it on normalized.
        return str(spec)
