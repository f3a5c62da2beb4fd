"""Command-line flags generated from frozen config dataclasses.

Every field becomes `--field VALUE`, its help text taken from the comment after the
field in the class source (or the field's name when there is none), its default from
the preset the script starts from. Only flags given on the command line change the
preset, through `dataclasses.replace`, so the config's own validation reports bad
values (`--learning_rate -1`, `--batch_size 0`) as a normal argparse error.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

# Other names a preset answers to: the scripts' `default` preset is the one sized for one
# accelerator (what a train script picks where JAX finds a GPU or TPU).
PRESET_ALIASES = MappingProxyType({"accelerator": "default"})

_FIELD_RE = re.compile(r"^\s+(\w+)\s*:\s*[^=#]+?(?:=\s*[^#]*)?#\s*(.+?)\s*$")


def field_docs(cls: type) -> dict[str, str]:
    """field name -> trailing comment, from `cls` and its dataclass bases (subclass wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names = set(klass.__dataclass_fields__)
        for line in source.splitlines():
            m = _FIELD_RE.match(line)
            if m and m.group(1) in names:
                docs[m.group(1)] = m.group(2)
    return docs


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _converter(annotation: Any):
    """A function str -> value for a field annotation such as 'int', 'float | None', 'bool'."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    parts = [p.strip() for p in text.split("|")]
    optional = "None" in parts
    base = [p for p in parts if p != "None"]
    if len(base) != 1 or base[0] not in ("int", "float", "str", "bool"):
        raise TypeError(f"cannot make a flag for a field of type {text!r}")
    convert = {"int": int, "float": float, "str": str, "bool": _parse_bool}[base[0]]

    def parse(value: str):
        if optional and value.strip().lower() == "none":
            return None
        try:
            return convert(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {text}, got {value!r}") from None

    parse.__name__ = text  # argparse names the type in its error messages
    return parse


def _help(text: str) -> str:
    """Help text as argparse takes it: it %-formats help, so a literal % (a "15% task") is doubled."""
    return text.replace("%", "%%")


def _refuse(flag: str, why: str):
    def parse(value: str):
        raise argparse.ArgumentTypeError(f"{flag} cannot be given here: {why}")

    return parse


def add_config_flags(parser: argparse.ArgumentParser, config: Any, title: str, dest_prefix: str,
                     fixed: Mapping[str, str] = MappingProxyType({})) -> None:
    """One `--field` per dataclass field of `config`, defaulting to `config`'s value.

    dest_prefix keeps the parsed values of each config apart (`model.d_model`); the
    flag itself is the bare field name, so names must be unique across configs.
    fixed: field -> why the run sets it itself; such a flag is refused with that reason,
    not accepted and then silently overridden.
    """
    group = parser.add_argument_group(title, inspect.getdoc(type(config)) or None)
    docs = field_docs(type(config))
    hints = {f.name: f.type for f in dataclasses.fields(config)}
    for f in dataclasses.fields(config):
        default = getattr(config, f.name)
        if f.name in fixed:
            group.add_argument(f"--{f.name}", dest=f"{dest_prefix}.{f.name}", default=argparse.SUPPRESS,
                               type=_refuse(f"--{f.name}", fixed[f.name]), metavar="(refused)",
                               help=_help(f"set by the run: {fixed[f.name]}"))
            continue
        group.add_argument(
            f"--{f.name}",
            dest=f"{dest_prefix}.{f.name}",
            type=_converter(hints[f.name]),
            default=argparse.SUPPRESS,
            metavar=str(hints[f.name]).replace(" ", "").upper(),
            help=_help(f"{docs.get(f.name, f.name.replace('_', ' '))} (default: {default!r})"),
        )


def build_parser(description: str, configs: dict[str, tuple[str, Any]], presets: Sequence[str] = (),
                 default_preset: str | None = None,
                 fixed: Mapping[str, str] = MappingProxyType({})) -> argparse.ArgumentParser:
    """A parser with `--preset` (if presets) and flags for each config in `configs`.

    configs: dest prefix -> (group title, config instance giving the defaults);
    fixed: flags refused, with the reason (see `add_config_flags`).
    """
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    if presets:
        which = (f"those of the --preset given, else of {default_preset}" if default_preset is not None else
                 "those of the preset in effect: without --preset, cpu where JAX finds no accelerator, "
                 "else default")
        aliases = {alias: name for alias, name in PRESET_ALIASES.items() if name in presets}
        also = "".join(f"; {alias} is {name}" for alias, name in aliases.items())
        parser.add_argument("--preset", choices=[*presets, *aliases], default=default_preset,
                            help=f"starting point for every flag below; the defaults shown are {which} "
                                 f"(try --preset NAME --help){also}")
    seen: dict[str, str] = {}
    for prefix, (title, config) in configs.items():
        for f in dataclasses.fields(config):
            if f.name in seen or f.name == "preset":
                raise ValueError(f"flag --{f.name} is defined by both {seen.get(f.name)} and {prefix}")
            seen[f.name] = prefix
        add_config_flags(parser, config, title, prefix, fixed)
    return parser


GROUP_TITLES = {"model": "model", "train": "training", "run": "run",
                "execution": "execution: how it runs; may change when a run resumes"}


def script_parser(description: str, configs: dict[str, Any], presets: Sequence[str],
                  fixed: Mapping[str, str] = MappingProxyType({})) -> argparse.ArgumentParser:
    """A train script's parser: `--preset` (without it, the one for the backend) and a flag group per config;
    `fixed` names the flags the run sets itself (e.g. the vocabulary, from the tokenizer)."""
    return build_parser(
        description, {name: (f"{GROUP_TITLES.get(name, name)} ({type(c).__name__})", c) for name, c in configs.items()},
        presets=list(presets), fixed=fixed)


def apply_flags(parser: argparse.ArgumentParser, args: argparse.Namespace,
                configs: dict[str, Any]) -> dict[str, Any]:
    """The configs with the flags that were given applied; a bad value is a parser error."""
    given: dict[str, dict[str, Any]] = {prefix: {} for prefix in configs}
    for key, value in vars(args).items():
        prefix, _, name = key.partition(".")
        if prefix in given and name:
            given[prefix][name] = value
    out = {}
    for prefix, config in configs.items():
        try:
            out[prefix] = dataclasses.replace(config, **given[prefix])
        except (ValueError, TypeError) as err:
            parser.error(str(err))
    return out


def given_preset(argv: Sequence[str] | None) -> str | None:
    """The value of --preset in argv (None: sys.argv[1:]), or None when it is not there."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--preset", default=None)
    return pre.parse_known_args(argv)[0].preset


def parse_configs(parser_fn, presets: dict[str, dict[str, Any]], argv: Sequence[str] | None,
                  default_preset: str) -> tuple[str, dict[str, Any]]:
    """Parse argv: pick the preset, then apply the flags given on top of it.

    parser_fn(preset configs) -> parser; presets: name -> {prefix: config}.
    Returns (preset name, {prefix: config}); an alias (`--preset accelerator`) returns the name it stands for.
    """
    given = given_preset(argv)
    given = PRESET_ALIASES.get(given, given)
    name = given if given in presets else default_preset
    parser = parser_fn(presets[name])
    args = parser.parse_args(argv)  # an unknown --preset is refused here, with the choices
    return name, apply_flags(parser, args, presets[name])
