import asyncio
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from chat.inference_client import ChatRequest, Delta, Finish, InferenceError, get_client
from chat.management import probes
from chat.rates import decode_rate

WARMUP_PROMPT = "Say hello in one short sentence."
WARMUP_MAX_TOKENS = 32
PROGRESS_EVERY = 5.0  # seconds between "still waiting" lines


@dataclass(frozen=True)
class ReplyFigures:
    ttft_ms: float
    tokens: int
    tokens_per_second: float | None
    finish_reason: str


class Command(BaseCommand):
    help = "Wait until every inference server is ready, run a warm-up reply and print its figures."

    def add_arguments(self, parser):
        parser.add_argument(
            "--timeout",
            type=float,
            default=300.0,
            help="Seconds to wait for all servers to be ready (default 300).",
        )
        parser.add_argument(
            "--local",
            action="store_true",
            help="Instead: load and convert the model in this process (GGUF to cached "
            "safetensors) so the next `python -m inference` starts fast.",
        )

    def handle(self, *args, timeout: float, local: bool, **options):
        probes.quiet_http_logs()
        if local:
            return self.prepare_local()
        deadline = time.monotonic() + timeout
        for url in settings.INFERENCE_URLS:
            state = self.wait_ready(url, deadline, timeout)
            self.stdout.write(f"{url}: {state.status}, model {state.model or '(unknown)'}")
        for figures in self.warm_up():
            self.stdout.write(
                f"warm-up reply: TTFT {figures.ttft_ms:.0f} ms, {figures.tokens} tokens, "
                f"{_rate(figures.tokens_per_second)}, finish {figures.finish_reason}"
            )

    # --- waiting ---

    def wait_ready(self, url: str, deadline: float, timeout: float) -> probes.ReadyState:
        started = last_report = time.monotonic()
        self.stdout.write(f"waiting for {url} to be ready (up to {timeout:.0f} s)")
        while True:
            state = probes.ready_state(url)
            if state.ready:
                return state
            if state.status == "failed":
                # A load that failed does not recover by waiting.
                raise CommandError(
                    f"The inference server at {url} failed to load its model: {state.error}"
                )
            if time.monotonic() >= deadline:
                raise CommandError(_not_ready_sentence(url, state, timeout))
            if time.monotonic() - last_report >= PROGRESS_EVERY:
                last_report = time.monotonic()
                self.stdout.write(f"  {url}: {state.status} ({last_report - started:.0f} s)")
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    # --- warm-up reply ---

    def warm_up(self) -> list[ReplyFigures]:
        # One reply per server, sent together: the client sends each to the least busy
        # server, so every replica gets warmed.
        count = max(1, len(settings.INFERENCE_URLS))
        try:
            return asyncio.run(_replies(count))
        except InferenceError as exc:
            raise CommandError(f"The warm-up reply failed: {exc.message}") from exc

    # --- --local ---

    def prepare_local(self) -> None:
        try:
            from inference import model_store
            from inference.settings import Settings
        except ImportError as exc:
            raise CommandError(
                f"--local needs the inference package and its dependencies: {exc}"
            ) from exc
        inference_settings = Settings()
        if inference_settings.engine == "fake":
            self.stdout.write("ENGINE=fake has no model to prepare.")
            return
        started = time.monotonic()
        with StageBar(total=_expected_stages(model_store, inference_settings)) as bar:
            try:
                loaded = model_store.prepare_model(inference_settings, progress=bar.step)
            except (OSError, ValueError) as exc:
                raise CommandError(f"The model could not be prepared: {exc}") from exc
        model = loaded.model
        self.stdout.write(
            f"model ready in {time.monotonic() - started:.1f} s from {loaded.folder} "
            f"({getattr(model, 'dtype', '?')}, {getattr(model, 'device', '?')}): "
            "the next `python -m inference` loads it from there"
        )


async def _replies(count: int) -> list[ReplyFigures]:
    client = get_client()
    try:
        return list(await asyncio.gather(*(_reply(client) for _ in range(count))))
    finally:
        await client.aclose()


async def _reply(client) -> ReplyFigures:
    request = ChatRequest(
        messages=[{"role": "user", "content": WARMUP_PROMPT}],
        model=settings.INFERENCE_MODEL,
        max_tokens=WARMUP_MAX_TOKENS,
    )
    started = time.monotonic()
    first = None
    deltas = 0
    finish = Finish("stop")
    async for item in client.stream_chat(request):
        if isinstance(item, Delta):
            first = first or time.monotonic()
            deltas += 1
        elif isinstance(item, Finish):  # not a Progress report before the first token
            finish = item
    ended = time.monotonic()
    tokens = finish.usage.get("completion_tokens") or deltas
    first = first or ended
    return ReplyFigures(
        ttft_ms=(first - started) * 1000,
        tokens=tokens,
        tokens_per_second=decode_rate(tokens, first - started, ended - started),
        finish_reason=finish.reason,
    )


def _rate(tokens_per_second: float | None) -> str:
    return "tokens/s n/a" if tokens_per_second is None else f"{tokens_per_second:.1f} tokens/s"


def _not_ready_sentence(url: str, state: probes.ReadyState, timeout: float) -> str:
    if not state.reachable:
        return probes.unreachable_sentence(url)
    return f"The inference server at {url} is still {state.status} after {timeout:.0f} s."


def _expected_stages(model_store, inference_settings) -> int:
    """How many progress messages prepare_model will send: 7 when a GGUF is converted
    first (converting, three steps, converted, loading, loaded), else 2."""
    try:
        source = Path(model_store.model_source(inference_settings)).expanduser()
        cached = inference_settings.model_cache_dir / model_store.cache_key(source) / "config.json"
        return 2 if cached.is_file() else 7
    except (OSError, ValueError):
        return 2


class StageBar:
    """A tqdm bar advanced by each progress message, redrawn every second so its clock
    keeps moving through the long dequantize step."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            file=sys.stderr,
            unit="step",
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]",
        )
        self._done = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self) -> "StageBar":
        self._ticker.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        self._ticker.join()
        if exc_info[0] is None:
            self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()

    def step(self, message: str) -> None:
        self.bar.set_description_str(message[:60])
        if self.bar.n < self.bar.total:
            self.bar.update(1)

    def _tick(self) -> None:
        while not self._done.wait(1.0):
            self.bar.refresh()
