"""Settings written once: a pydantic-settings model, and the command line made from it.

Each option is one field with its type, default, help text and environment variable
(``<prefix><NAME>``); the flags of ``choreo serve``, ``choreo operator`` and ``choreo agent``
are generated from the fields, so a default or a help text cannot drift between the two.
A flag given on the command line wins over the environment, which wins over the default.
"""

from __future__ import annotations

import argparse
from types import NoneType, UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


class SettingsError(ValueError):
    """A setting's value does not fit: the message names the flag and the problem."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseSettings]) -> None:
    """One flag per field of ``model`` (``--max-buckets`` for ``max_buckets``); flags not
    given stay out of the namespace, so the environment and the model's defaults apply."""
    prefix = model.model_config.get("env_prefix", "")
    for name, field in model.model_fields.items():
        kind = field.annotation
        if get_origin(kind) in (Union, UnionType):
            kind = next(a for a in get_args(kind) if a is not NoneType)
        default = field.get_default(call_default_factory=True)
        env = f"${prefix}{name.upper()}"
        shown = "" if default in (None, "", []) else f"; default {default}"
        help_text = f"{field.description or ''} ({env}{shown})".replace("%", "%%")
        options: dict[str, Any] = {"default": argparse.SUPPRESS, "help": help_text,
                                   "dest": name}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif get_origin(kind) is Literal:
            options["choices"] = get_args(kind)
        elif get_origin(kind) is list:
            options.update(action="append", metavar=name.upper())
        else:
            options["type"] = kind if kind in (int, float) else str
            options["metavar"] = name.upper()
        parser.add_argument(flag(name), **options)


def from_arguments(model: type[S], args: argparse.Namespace) -> S:
    """The settings from the flags given, then the environment, then the defaults."""
    given = {k: v for k, v in vars(args).items() if k in model.model_fields}
    prefix = model.model_config.get("env_prefix", "")

    def source(loc: tuple[Any, ...]) -> str:
        name = str(loc[0]) if loc else ""
        return flag(name) if name in given else f"${prefix}{name.upper()}"

    try:
        return model(**given)
    except ValidationError as err:
        raise SettingsError("; ".join(f"{source(e['loc'])}: {e['msg']}"
                                      for e in err.errors())) from None
