"""Settings.engine -> an Engine, the way Channels picks a channel layer's BACKEND: a dotted
path to the class, or one of the short names in settings.ENGINES. Imported lazily, so the
fake engine never pulls in torch."""

from __future__ import annotations

import importlib

from inference.engine import Engine
from inference.settings import ENGINES, Settings


def engine_class(name: str) -> type[Engine]:
    path = ENGINES.get(name, name)
    module, _, attr = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"ENGINE={name}: cannot import {path} ({exc})") from exc
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise ValueError(f"ENGINE={name}: {path} is not a subclass of inference.engine.Engine")
    return cls


def create_engine(settings: Settings) -> Engine:
    return engine_class(settings.engine)(settings)
