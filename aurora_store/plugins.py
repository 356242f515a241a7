"""Extension points name their implementations by ``"package.module:attr"`` strings (builtins, entry points,
user registrations) so a registry imports nothing until an implementation is used. One resolver for all of
them: the bucket-scheme registry and the actors' engine registry."""

from __future__ import annotations

import importlib
import re

from aurora_store.errors import ConfigError

#: ``package.module:attr`` or ``package.module:Class.attr``.
TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def resolve(spec: str, what: str) -> object:
    """The callable ``spec`` names, imported now; ``what`` (e.g. ``"engine 'vllm'"``) names it in errors."""
    if not TARGET.match(spec):
        raise ConfigError(f"{what}: {spec!r} is not a 'package.module:attr' string")
    module_name, _, attr_path = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            target = getattr(target, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{what}: cannot load {spec!r}: {exc}") from exc
    if not callable(target):
        raise ConfigError(f"{what}: {spec!r} is not callable")
    return target
