"""The operator's figures (/admin/usage/): tokens and replies per day, top users and
models, time to first token and decode speed, failures and cancellations, and the live
state of every inference server.

Everything is summed from UsageDay rows (one per user, model, day and source), so a month
of a busy site is a few thousand rows however many replies it holds, and the page stays
fast after years of use.
"""

import asyncio
import csv
import datetime
import io
from dataclasses import dataclass, field

import httpx
from django.conf import settings
from django.db.models import F, Sum
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from chat.models import TTFT_BUCKET_FIELDS, TTFT_BUCKETS_MS, UsageDay

WINDOW_DAYS = 30
TOP = 10
COUNTS = ("prompt_tokens", "completion_tokens", "replies", "failures", "cancellations")
LATENCY = ("ttft_count", "ttft_ms_total", "decode_tokens", "decode_ms", *TTFT_BUCKET_FIELDS)
SERVER_TIMEOUT = 0.8  # the page must load in under a second even with a server down


@dataclass
class Figures:
    """Sums of UsageDay rows for one day, user, model or the whole window."""

    label: str
    sums: dict = field(default_factory=dict)

    def __getattr__(self, name):
        try:
            return self.__dict__["sums"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def total_tokens(self) -> int:
        return self.sums.get("prompt_tokens", 0) + self.sums.get("completion_tokens", 0)

    @property
    def completed(self) -> int:
        return self.sums.get("replies", 0) - self.sums.get("failures", 0) - self.sums.get(
            "cancellations", 0)

    @property
    def ttft_p50_ms(self) -> float | None:
        return ttft_percentile(self.sums, 0.50)

    @property
    def ttft_p95_ms(self) -> float | None:
        return ttft_percentile(self.sums, 0.95)

    @property
    def ttft_mean_ms(self) -> float | None:
        count = self.sums.get("ttft_count", 0)
        return self.sums["ttft_ms_total"] / count if count else None

    @property
    def tokens_per_second(self) -> float | None:
        decode_ms = self.sums.get("decode_ms", 0)
        return self.sums["decode_tokens"] * 1000 / decode_ms if decode_ms else None


def ttft_percentile(sums: dict, q: float) -> float | None:
    """Estimated from the histogram: linear within the bucket the percentile falls in; in
    the open last bucket, its lower bound (the answer is then "at least that")."""
    counts = [sums.get(name, 0) or 0 for name in TTFT_BUCKET_FIELDS]
    total = sum(counts)
    if not total:
        return None
    target = q * total
    seen, lower = 0, 0
    for bound, count in zip((*TTFT_BUCKETS_MS, None), counts):
        if count and seen + count >= target:
            if bound is None:
                return float(lower)
            return lower + (target - seen) / count * (bound - lower)
        seen += count
        lower = bound if bound is not None else lower
    return float(lower)


def _sum_columns() -> dict:
    # Aliased: an annotation may not take the name of a model field.
    return {f"sum_{name}": Sum(name) for name in (*COUNTS, *LATENCY)}


def _figures(label: str, row: dict) -> Figures:
    return Figures(label, {name: row.get(f"sum_{name}") or 0 for name in (*COUNTS, *LATENCY)})


def usage_window(*, days: int = WINDOW_DAYS, today: datetime.date | None = None) -> dict:
    """The dashboard's figures for the last `days` days (UTC), today included."""
    today = today or timezone.localdate()
    start = today - datetime.timedelta(days=days - 1)
    rows = UsageDay.objects.filter(day__gte=start, day__lte=today)
    sums = _sum_columns()
    by_day = {row["day"]: row for row in rows.values("day").annotate(**sums)}
    series = [_figures(str(day), by_day.get(day, {}))
              for day in (start + datetime.timedelta(days=n) for n in range(days))]
    ranked = {"total": F("sum_prompt_tokens") + F("sum_completion_tokens")}
    users = (rows.values("user__username").annotate(**sums).annotate(**ranked)
             .order_by("-total", "user__username")[:TOP])
    models = rows.values("model").annotate(**sums).annotate(**ranked).order_by("-total", "model")
    sources = {row["source"]: row for row in rows.values("source").annotate(**sums)}
    model_figures = [_figures(row["model"] or "(server default)", row) for row in models]
    return {
        "start": start,
        "today": today,
        "days": series,
        "users": [_figures(row["user__username"], row) for row in users],
        "models": model_figures[:TOP],
        "total": Figures("total", _add(f.sums for f in model_figures)),
        "sources": {name: _figures(name, row) for name, row in sources.items()},
        "active_users": rows.values("user_id").distinct().count(),
    }


def _add(rows) -> dict:
    total: dict = {}
    for sums in rows:
        for name, value in sums.items():
            total[name] = total.get(name, 0) + (value or 0)
    return total


# --- the chart -----------------------------------------------------------------------

CHART_HEIGHT = 140
BAR_WIDTH = 18
BAR_STEP = 24


def chart(series: list[Figures], parts: tuple[str, ...]) -> dict:
    """Stacked bars (one per day) as SVG rectangles: the template only draws them."""
    top = max((sum(getattr(day, part) for part in parts) for day in series), default=0) or 1
    bars = []
    for index, day in enumerate(series):
        y = CHART_HEIGHT
        stack = []
        for part in parts:
            value = getattr(day, part)
            height = round(value / top * CHART_HEIGHT, 1)
            y -= height
            stack.append({"part": part, "value": value, "y": round(y, 1), "height": height})
        bars.append({"day": day.label, "x": index * BAR_STEP, "stack": stack})
    return {"bars": bars, "max": top, "width": len(series) * BAR_STEP,
            "height": CHART_HEIGHT, "bar_width": BAR_WIDTH}


# --- CSV -----------------------------------------------------------------------------

CSV_COLUMNS = ("section", "name", "prompt_tokens", "completion_tokens", "total_tokens",
               "replies", "failures", "cancellations", "ttft_p50_ms", "ttft_p95_ms",
               "tokens_per_second")


def _csv_row(section: str, figures: Figures) -> list:
    def rounded(value, digits=0):
        return "" if value is None else round(value, digits) if digits else round(value)

    return [section, figures.label, figures.prompt_tokens, figures.completion_tokens,
            figures.total_tokens, figures.replies, figures.failures, figures.cancellations,
            rounded(figures.ttft_p50_ms), rounded(figures.ttft_p95_ms),
            rounded(figures.tokens_per_second, 1)]


def usage_csv(window: dict) -> str:
    """The dashboard's figures, one row per day, top user, model and the total."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    sections = [("day", window["days"]), ("user", window["users"]),
                ("model", window["models"]), ("total", [window["total"]])]
    for section, figures in sections:
        for one in figures:
            writer.writerow(_csv_row(section, one))
    return out.getvalue()


# --- inference servers, live ---------------------------------------------------------


def _metric_values(text: str) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels:
                values[sample.name] = sample.value
    return values


async def _server_state(client: httpx.AsyncClient, url: str) -> dict:
    state = {"url": url, "reachable": False, "ready": False, "status": "", "model": "",
             "queue": None, "running": None}
    try:
        ready, metrics = await asyncio.gather(client.get(f"{url}/ready"),
                                              client.get(f"{url}/metrics"))
    except httpx.HTTPError as exc:
        state["status"] = "no answer" if isinstance(exc, httpx.TimeoutException) else "unreachable"
        return state
    body = ready.json() if ready.headers.get("content-type", "").startswith("application/json") else {}
    state.update(reachable=True, ready=ready.status_code == 200,
                 status=body.get("status") or f"HTTP {ready.status_code}",
                 model=body.get("model") or "")
    if metrics.status_code == 200:
        values = _metric_values(metrics.text)
        state["queue"] = values.get("inference_queue_depth")
        state["running"] = values.get("inference_running_sequences")
    return state


async def server_states() -> list[dict]:
    """Every server in INFERENCE_URLS, asked at once: /ready, and the queue and running
    gauges of /metrics (servers without them show blanks)."""
    headers = {}
    if settings.INFERENCE_API_KEY:
        headers["Authorization"] = f"Bearer {settings.INFERENCE_API_KEY}"
    async with httpx.AsyncClient(timeout=SERVER_TIMEOUT, headers=headers) as client:
        urls = [url.rstrip("/") for url in settings.INFERENCE_URLS]
        return list(await asyncio.gather(*(_server_state(client, url) for url in urls)))
