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
from django.contrib.auth import get_user_model
from django.db.models import Sum
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from chat.models import TTFT_BUCKET_FIELDS, TTFT_BUCKETS_MS, UsageDay

User = get_user_model()

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
        if name in (*COUNTS, *LATENCY):  # a day without replies has no sums: zeros
            return self.__dict__["sums"].get(name, 0)
        raise AttributeError(name)

    @property
    def total_tokens(self) -> int:
        return self.sums.get("prompt_tokens", 0) + self.sums.get("completion_tokens", 0)

    @property
    def completed(self) -> int:
        return (
            self.sums.get("replies", 0)
            - self.sums.get("failures", 0)
            - self.sums.get("cancellations", 0)
        )

    @property
    def ttft_p50_ms(self) -> float | None:
        return ttft_percentile(self.sums, 0.50)

    @property
    def ttft_p95_ms(self) -> float | None:
        return ttft_percentile(self.sums, 0.95)

    @property
    def ttft_mean_ms(self) -> float | None:
        count = self.sums.get("ttft_count", 0)
        return self.sums.get("ttft_ms_total", 0) / count if count else None

    @property
    def tokens_per_second(self) -> float | None:
        decode_ms = self.sums.get("decode_ms", 0)
        return self.sums.get("decode_tokens", 0) * 1000 / decode_ms if decode_ms else None


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


def usage_window(*, days: int = WINDOW_DAYS, today: datetime.date | None = None) -> dict:
    """The dashboard's figures for the last `days` days (UTC), today included.

    Two passes over the window's rows: sums by (day, model, source), folded here into days,
    models, sources and the total; and sums by user, for the top users. (Five queries, one
    per grouping, took twice as long on a year of 200 users.)"""
    today = today or timezone.localdate()
    start = today - datetime.timedelta(days=days - 1)
    rows = UsageDay.objects.filter(day__gte=start, day__lte=today)
    groups = [
        (row["day"], row["model"], row["source"], _plain(row))
        for row in rows.values("day", "model", "source").annotate(**_sum_columns())
    ]
    by_day, by_model, by_source = {}, {}, {}
    for day, model, source, sums in groups:
        _add_into(by_day.setdefault(day, {}), sums)
        _add_into(by_model.setdefault(model, {}), sums)
        _add_into(by_source.setdefault(source, {}), sums)
    series = [
        Figures(str(day), by_day.get(day, {}))
        for day in (start + datetime.timedelta(days=n) for n in range(days))
    ]
    models = sorted(by_model.items(), key=lambda item: (-_total(item[1]), item[0]))
    return {
        "start": start,
        "today": today,
        "days": series,
        "models": [Figures(name or "(server default)", sums) for name, sums in models[:TOP]],
        "total": Figures("total", _add(sums for _, _, _, sums in groups)),
        "sources": {name: Figures(name, sums) for name, sums in by_source.items()},
        **_top_users(rows),
    }


def _top_users(rows) -> dict:
    counts = {f"sum_{name}": Sum(name) for name in COUNTS}
    users = [(row["user_id"], _plain(row)) for row in rows.values("user_id").annotate(**counts)]
    users.sort(key=lambda item: -_total(item[1]))
    top = users[:TOP]
    names = dict(User.objects.filter(pk__in=[pk for pk, _ in top]).values_list("pk", "username"))
    return {
        "users": [Figures(names.get(pk, str(pk)), sums) for pk, sums in top],
        "active_users": len(users),
    }


def _plain(row: dict) -> dict:
    return {name[4:]: value or 0 for name, value in row.items() if name.startswith("sum_")}


def _total(sums: dict) -> int:
    return sums.get("prompt_tokens", 0) + sums.get("completion_tokens", 0)


def _add_into(total: dict, sums: dict) -> None:
    for name, value in sums.items():
        total[name] = total.get(name, 0) + value


def _add(rows) -> dict:
    total: dict = {}
    for sums in rows:
        _add_into(total, sums)
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
    return {
        "bars": bars,
        "max": top,
        "width": len(series) * BAR_STEP,
        "height": CHART_HEIGHT,
        "bar_width": BAR_WIDTH,
    }


# --- CSV -----------------------------------------------------------------------------

CSV_COLUMNS = (
    "section",
    "name",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "replies",
    "failures",
    "cancellations",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "tokens_per_second",
)


def _csv_row(section: str, figures: Figures) -> list:
    def rounded(value, digits=0):
        return "" if value is None else round(value, digits) if digits else round(value)

    return [
        section,
        figures.label,
        figures.prompt_tokens,
        figures.completion_tokens,
        figures.total_tokens,
        figures.replies,
        figures.failures,
        figures.cancellations,
        rounded(figures.ttft_p50_ms),
        rounded(figures.ttft_p95_ms),
        rounded(figures.tokens_per_second, 1),
    ]


def usage_csv(window: dict) -> str:
    """The dashboard's figures, one row per day, top user, model and the total."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    sections = [
        ("day", window["days"]),
        ("user", window["users"]),
        ("model", window["models"]),
        ("total", [window["total"]]),
    ]
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
    state = {
        "url": url,
        "reachable": False,
        "ready": False,
        "status": "",
        "model": "",
        "queue": None,
        "running": None,
    }
    try:
        ready, metrics = await asyncio.gather(
            client.get(f"{url}/ready"), client.get(f"{url}/metrics")
        )
    except httpx.HTTPError as exc:
        state["status"] = "no answer" if isinstance(exc, httpx.TimeoutException) else "unreachable"
        return state
    body = (
        ready.json() if ready.headers.get("content-type", "").startswith("application/json") else {}
    )
    state.update(
        reachable=True,
        ready=ready.status_code == 200,
        status=body.get("status") or f"HTTP {ready.status_code}",
        model=body.get("model") or "",
    )
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
