"""One entry of the options table (options.py): how an option is spelled on the command line, in the
pytest plugin and in the environment, what its help says, and how its text is read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardspec.conformance.run import option_values as read
from shardspec.conformance.usage import UsageError

PLUGIN_PREFIX = "--shardspec-"


@dataclass(frozen=True)
class Option:
    """One option of a run, declared once; the command line, the plugin and the docs are made from it."""

    name: str  # the key of its value (argparse's dest; the plugin's dest is shardspec_<name>)
    flag: str  # the command line's long flag; the plugin's is --shardspec-<flag without the dashes>
    help: str
    kind: str = "value"  # "value": one text; "switch": given or not; "repeat": each use adds one text
    parse: Callable[[Any, str], Any] = read.text  # (text, where) -> value, or a UsageError naming `where`
    # The value where neither the flag nor the variable is given; a callable computes it from the values
    # resolved so far (default_text then says what it is).
    default: Any = None
    env: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    short: str | None = None  # an extra command-line spelling (-v)
    default_text: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("value", "switch", "repeat"):
            raise ValueError(f"{self.flag}: unknown kind {self.kind!r}")
        if self.kind == "repeat" and self.env is not None:
            raise ValueError(f"{self.flag}: a repeated option has no variable (one text cannot say where it splits)")
        if self.choices and self.kind != "value":
            raise ValueError(f"{self.flag}: only a value has choices")

    @property
    def plugin_flag(self) -> str:
        return PLUGIN_PREFIX + self.flag.removeprefix("--")

    @property
    def plugin_dest(self) -> str:
        return f"shardspec_{self.name}"

    @property
    def shown_default(self) -> str | None:
        if self.default_text is not None:
            return self.default_text
        if self.kind != "value" or self.default is None or callable(self.default):
            return None
        if isinstance(self.default, list):
            return ",".join(map(str, self.default))
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    @property
    def full_help(self) -> str:
        """The help both parsers show: the text, the default and the variable."""
        text = self.help
        if self.shown_default is not None:
            text += f" (default {self.shown_default})"
        return text + (f" [env {self.env}]" if self.env else "")

    def parser_kwargs(self) -> dict[str, Any]:
        """argparse's keywords (pytest's addoption takes the same). Nothing is parsed or defaulted there:
        an option not given is None, so that its variable is read, and resolve() checks every value."""
        kwargs: dict[str, Any] = {"help": self.full_help.replace("%", "%%"), "default": None}
        if self.kind == "switch":
            kwargs["action"] = "store_true"
        else:
            kwargs["action"] = "append" if self.kind == "repeat" else "store"
            kwargs["metavar"] = "{" + ",".join(self.choices) + "}" if self.choices else self.metavar
        return kwargs

    def read(self, raw: Any, where: str) -> Any:
        if self.kind == "switch":
            return read.flag(raw, where)
        if self.kind == "repeat":
            return [self.parse(item, where) for item in raw]
        if self.choices:
            value = str(raw).strip()
            if value not in self.choices:
                raise UsageError(f"{where}: {raw!r} is not one of {', '.join(self.choices)}")
            return value
        return self.parse(raw, where)
