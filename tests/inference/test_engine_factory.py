"""ENGINE picks the engine class like a Channels layer's BACKEND: short name or dotted path."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inference.engine_factory import create_engine, engine_class
from inference.fake_engine import FakeEngine
from inference.settings import ENGINES, Settings
from tests.support.inference_app import fake_settings


def test_short_names_and_dotted_paths_name_the_same_class() -> None:
    assert engine_class("fake") is FakeEngine
    assert engine_class("inference.fake_engine.FakeEngine") is FakeEngine
    assert ENGINES["transformers"] == "inference.hf_engine.TransformersEngine"


def test_create_engine_builds_the_class_with_the_settings() -> None:
    settings = fake_settings(engine="inference.fake_engine.FakeEngine", model_name="echo")
    engine = create_engine(settings)
    assert (
        isinstance(engine, FakeEngine)
        and engine.settings is settings
        and engine.model_name == "echo"
    )


@pytest.mark.parametrize("path", ["inference.nowhere.Engine", "inference.settings.Settings"])
def test_a_path_that_is_no_engine_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match=f"ENGINE={path}"):
        engine_class(path)


@pytest.mark.parametrize("name", ["nope", "", "a..b", "1.x"])
def test_settings_refuse_what_is_neither_short_name_nor_dotted_path(name: str) -> None:
    with pytest.raises(ValidationError, match="engine"):
        Settings(engine=name)
