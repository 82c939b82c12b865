"""A command's options built from the fields of a dataclass (``dyntc reproduce``'s from
:class:`~dyntc.protocol.options.ReproduceOptions`, ``dyntc train``'s from
:class:`~dyntc.protocol.single.SingleModelConfig`) or from a function's parameters (``dyntc fit``'s
from :class:`~dyntc.classifier.DynamicClassifier`'s constructor: same names, same defaults).

Each field gives one option: its name (typer's ``--field-name``, or the metadata's ``flag``), its
help (metadata ``help``), its default (metadata ``command_line_default``, a value or a function giving
it, else the field's; a field without a default is a required option) and the type the command line
parses: a union's first member (optional where the union allows None), a list of ``FIELD=VALUE``
items for a ``dict[str, str]`` (:func:`item_fields`; the command parses them).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer


def _is_dict(hint: Any) -> bool:
    return hint is dict or typing.get_origin(hint) is dict


def _is_items(hint: Any) -> bool:
    """Whether a field of type `hint` is a ``dict`` (optional or not), given as FIELD=VALUE items."""
    return any(_is_dict(t) for t in (hint, *typing.get_args(hint)))


def _command_line_type(hint: Any) -> Any:
    """The type the command line parses for a field of type `hint`: a union's first member (optional
    where the union allows None); a list of ``FIELD=VALUE`` items for a ``dict[str, str]``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = typing.get_args(hint)
        first = _command_line_type(next(m for m in members if m is not type(None)))
        return Optional[first] if type(None) in members else first
    return list[str] if _is_dict(hint) else hint


def _option(f: dataclasses.Field, hint: Any) -> inspect.Parameter:
    default = f.metadata.get("command_line_default", f.default)
    if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        default = f.default_factory
    if callable(default):
        default = default()
    if default is dataclasses.MISSING:
        default = inspect.Parameter.empty  # a required option
    names = [f.metadata["flag"]] if "flag" in f.metadata else []  # else typer's --field-name
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[_command_line_type(hint), typer.Option(*names, help=f.metadata["help"])])


def item_fields(config_cls: type) -> list[dataclasses.Field]:
    """The fields of `config_cls` that the command line gives as repeatable ``FIELD=VALUE`` items."""
    hints = typing.get_type_hints(config_cls)
    return [f for f in dataclasses.fields(config_cls) if _is_items(hints[f.name])]


def options_from_dataclass(command: Callable, config_cls: type) -> None:
    """Give `command` one option per field of `config_cls`, in the fields' order, after the options
    its own signature declares (a ``**options`` parameter there, which receives them, is left out of
    what typer reads)."""
    hints = typing.get_type_hints(config_cls)
    written = inspect.signature(command, eval_str=True).parameters.values()
    command.__signature__ = inspect.Signature([  # typer reads a command's options from its signature
        *(p for p in written if p.kind is not p.VAR_KEYWORD),
        *(_option(f, hints[f.name]) for f in dataclasses.fields(config_cls)),
    ])


def options_from_signature(command: Callable, function: Callable, help: dict[str, str], skip: tuple[str, ...] = ()) -> list[str]:
    """Give `command` one option per keyword parameter of `function` (but `skip`), named and
    defaulted as there, with `help` (one entry per parameter: a parameter without one is an error, so
    a new constructor parameter cannot be forgotten here); after the options `command` declares
    itself. Returns the parameters' names, for the command to pass them on."""
    hints = typing.get_type_hints(function)
    taken = [p for p in inspect.signature(function).parameters.values()
             if p.name != "self" and p.name not in skip and p.kind is not p.VAR_KEYWORD]
    missing = [p.name for p in taken if p.name not in help]
    if missing:
        raise TypeError(f"no command-line help for parameters {missing} of {function.__qualname__}")
    options = [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default,
                                 annotation=Annotated[_command_line_type(hints[p.name]), typer.Option(help=help[p.name])])
               for p in taken]
    written = inspect.signature(command, eval_str=True).parameters.values()
    command.__signature__ = inspect.Signature([*(p for p in written if p.kind is not p.VAR_KEYWORD), *options])
    return [p.name for p in taken]


__all__ = ["item_fields", "options_from_dataclass", "options_from_signature"]
