"""``python -m inference``: serve the model. Every setting is an env var and a CLI flag;
flags override env vars (``--help`` lists them all)."""

from __future__ import annotations

import argparse
import signal
import sys
import typing
from typing import Any

from inference.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference",
        description="tokenstream inference server (OpenAI-compatible, continuous batching).",
    )
    for name, field in Settings.model_fields.items():
        choices = (
            typing.get_args(field.annotation)
            if typing.get_origin(field.annotation) is typing.Literal
            else None
        )
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=None,
            choices=choices,
            metavar=None if choices else name.upper(),
            help=f"{field.description} [env {name.upper()}; default: {field.default!s}]",
        )
    return parser


def load_settings(argv: list[str] | None = None) -> Settings:
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None}
    return Settings(**overrides)  # init values win over env vars


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(argv)
    import uvicorn

    from inference.app import create_app

    # uvicorn shuts down gracefully on SIGTERM, then re-raises it under the previous handler;
    # this one turns that into a normal exit status 0 instead of "killed by SIGTERM".
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_timeout) or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
