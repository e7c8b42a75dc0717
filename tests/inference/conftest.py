"""Fixtures of the inference server tests (no Django here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from inference.settings import Settings
from tests.support.inference_app import LiveServer, fake_settings, model_settings


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "model: uses the real bundled model (loaded once per session; slower)"
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def live_fake() -> Iterator[Any]:
    """Factory: `with live_fake(**settings) as server:` a fake-engine server on a free port."""
    from inference.app import create_app

    def make(**overrides: Any) -> LiveServer:
        return LiveServer(create_app(fake_settings(**overrides)), ready=True)

    return make


@pytest.fixture(scope="session")
def loaded_model() -> Any:
    """The bundled model, loaded once per session (the first run converts the GGUF once
    into the default MODEL_CACHE_DIR, ~20-60 s; later runs load in seconds)."""
    from inference.model_store import prepare_model

    return prepare_model(Settings(model="", dtype="auto", device="cpu"))


@pytest.fixture(scope="session")
def loaded_model_other_kernel(loaded_model: Any) -> Any:
    """The bundled model through the other 4-bit kernel than the one INT4_KERNEL=auto chose
    for `loaded_model` on this machine (inference/q4mm.py), so both kernels meet the tests
    that need the real model; skipped where the native one cannot be built."""
    from inference import q4mm
    from inference.model_store import prepare_model
    from inference.quant import kernel_of

    if not q4mm.available():
        pytest.skip("the native 4-bit kernel cannot be built on this machine")
    kernel = "torch" if kernel_of(loaded_model.model) == "native" else "native"
    return prepare_model(Settings(model="", dtype="auto", device="cpu", int4_kernel=kernel))


@pytest.fixture(params=["auto", "other"])
def model_of_each_kernel(request: pytest.FixtureRequest) -> Any:
    """`loaded_model`, then `loaded_model_other_kernel`."""
    name = "loaded_model" if request.param == "auto" else "loaded_model_other_kernel"
    return request.getfixturevalue(name)


@pytest.fixture(scope="session")
def loaded_model_cuda() -> Any:
    """The bundled model on CUDA (DTYPE=auto: bfloat16 there)."""
    from inference.model_store import prepare_model

    return prepare_model(Settings(model="", dtype="auto", device="cuda"))


@pytest.fixture(scope="session")
def live_model(loaded_model: Any) -> Iterator[LiveServer]:
    from inference.app import create_app
    from inference.hf_engine import TransformersEngine

    engine = TransformersEngine(model_settings(), loaded=loaded_model)
    with LiveServer(create_app(model_settings(), engine=engine)) as server:
        server.wait_ready()
        yield server
