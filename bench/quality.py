"""Reply quality at sampling settings, side by side in one run: how often the bundled model
loops, how varied its replies are, how long they run, and whether it still knows Paris.

    .venv/bin/python -m bench.quality                                  # the site's defaults only
    .venv/bin/python -m bench.quality --setting repetition_penalty=1.1 \\
        --setting frequency_penalty=0.5,min_p=0.05 --samples 2

The first row has no penalties (temperature 0.5, top_p 0.9: what the site sent before it had
penalties), the second the site's defaults as configured (CHAT_DEFAULT_* in
tokenstream_site/settings.py and the environment, what a conversation that sets nothing gets).
Each --setting is a set of request fields laid over the first row's temperature and top_p.
Every prompt below runs once per sample with its own seed, the same seeds at every setting,
max_tokens 300, through `python -m inference` started in its own process, as deployed, 8
requests at a time. Which requests share a decode step varies with timing, and with it the
logits' last bits, so two runs differ by a reply or two per setting. Per setting:

- loops: replies in which some word 4-gram occurs 3 times or more (the model going round);
- distinct-4: distinct word 4-grams / all word 4-grams of a reply, averaged over replies;
- tokens: mean reply length in tokens;
- at limit: replies that ran to max_tokens instead of ending by themselves;
- Paris: whether every sample of "What is the capital of France?" says Paris.

Below the table, the prompts whose replies ran to the limit, per setting (with how many of
their samples did), to tell a rambling setting from prompts that want a long answer.

The targets, printed as `ok`: at most 1 reply in 10 loops, distinct-4 >= 0.95, at most 1
in 10 at the limit, Paris answered. bench/README.md keeps the measured table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.measure import sampling_fields
from tests.support.processes import InferenceServer

BASE: dict[str, Any] = {"temperature": 0.5, "top_p": 0.9}
MAX_TOKENS = 300
CONCURRENCY = 8
PARIS = "What is the capital of France?"
PROMPTS = [
    "Write a short poem about autumn leaves.",
    "Write a haiku about the morning sea.",
    "Write a limerick about a forgetful dog.",
    "Write a short story about a robot who learns to paint.",
    "Explain how a rainbow forms.",
    "Explain why the sky is blue, in simple words.",
    "Explain what a computer's memory does.",
    "How do plants make their food?",
    "Why do we have seasons on Earth?",
    "What is the difference between weather and climate?",
    "Describe the water cycle in a few sentences.",
    "Describe a cat to someone who has never seen one.",
    "Give me a simple recipe for pancakes.",
    "How do I make a cup of green tea?",
    "Give me a simple plan for a thirty-minute home workout.",
    "Write a Python function that reverses a string.",
    "Write a Python function that checks whether a number is prime.",
    'Translate "Good morning, how are you?" into French.',
    'Translate "Where is the train station?" into Spanish.',
    "List five fruits that are rich in vitamin C.",
    "List three tips for sleeping better.",
    "What are the benefits of regular exercise?",
    "Give me three ideas for a birthday party for a ten-year-old.",
    "What should I pack for a weekend camping trip?",
    "Write a polite email asking my manager for a day off.",
    "Write a thank-you note to a friend who helped me move.",
    "Summarize the story of Little Red Riding Hood.",
    "Suggest a name for a small coffee shop and explain why.",
    "How can I save money on groceries?",
    "Explain how to change a flat bicycle tire.",
    "What are some good habits for learning a new language?",
    PARIS,
]


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def four_grams(text: str) -> list[tuple[str, ...]]:
    w = words(text)
    return [tuple(w[i : i + 4]) for i in range(len(w) - 3)]


def loops(text: str) -> bool:
    """Some word 4-gram occurs 3 times or more."""
    return any(count >= 3 for count in Counter(four_grams(text)).values())


def distinct_4(text: str) -> float:
    grams = four_grams(text)
    return len(set(grams)) / len(grams) if grams else 1.0


@dataclass
class Reply:
    prompt: str
    seed: int
    text: str
    tokens: int
    finish: str


@dataclass
class Summary:
    label: str
    replies: list[Reply]

    @property
    def loop_share(self) -> float:
        return sum(loops(r.text) for r in self.replies) / len(self.replies)

    @property
    def limit_share(self) -> float:
        return sum(r.finish == "length" for r in self.replies) / len(self.replies)

    @property
    def paris(self) -> bool:
        return all("paris" in r.text.lower() for r in self.replies if r.prompt == PARIS)

    def row(self) -> str:
        n = len(self.replies)
        distinct = sum(distinct_4(r.text) for r in self.replies) / n
        tokens = sum(r.tokens for r in self.replies) / n
        ok = self.loop_share <= 0.1 and distinct >= 0.95 and self.limit_share <= 0.1 and self.paris
        return (
            f"| {self.label} | {round(self.loop_share * n)}/{n} | {distinct:.3f} | {tokens:.0f} | "
            f"{round(self.limit_share * n)}/{n} | {'yes' if self.paris else 'NO'} | {'ok' if ok else '-'} |"
        )


HEADER = (
    "| setting (over temperature 0.5, top_p 0.9) | loops | distinct-4 | tokens | at limit | Paris | targets |\n"
    "| --- | --- | --- | --- | --- | --- | --- |"
)


async def ask(client: httpx.AsyncClient, prompt: str, seed: int, fields: dict[str, Any]) -> Reply:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "seed": seed,
    }
    r = await client.post("/v1/chat/completions", json=body | BASE | fields)
    r.raise_for_status()
    reply = r.json()
    choice = reply["choices"][0]
    return Reply(
        prompt,
        seed,
        choice["message"]["content"],
        reply["usage"]["completion_tokens"],
        choice["finish_reason"],
    )


async def replies(url: str, fields: dict[str, Any], samples: int) -> list[Reply]:
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(prompt: str, seed: int) -> Reply:
            async with gate:
                return await ask(client, prompt, seed, fields)

        jobs = [one(p, 1000 * s + i) for s in range(samples) for i, p in enumerate(PROMPTS)]
        return list(await asyncio.gather(*jobs))


def site_defaults() -> dict[str, Any]:
    """The fields the chat site sends for a conversation that sets nothing (its settings, as
    configured by the environment), read the way the site reads them."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tokenstream_site.settings")
    from django.conf import settings

    from chat.sampling import KNOBS, site_default

    fields = {
        "temperature": settings.CHAT_DEFAULT_TEMPERATURE,
        "top_p": settings.CHAT_DEFAULT_TOP_P,
    }
    return fields | {k.name: v for k in KNOBS if (v := site_default(k)) is not None}


def at_limit(summary: Summary) -> str:
    counts = Counter(r.prompt for r in summary.replies if r.finish == "length")
    listed = "; ".join(f"{prompt} ({n})" for prompt, n in counts.most_common())
    return f"- {summary.label}: {listed or 'none'}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="K=V,...",
        help="request fields over the site's defaults, e.g. repetition_penalty=1.1,min_p=0.05; "
        "repeatable (the site's defaults always run first)",
    )
    ap.add_argument("--samples", type=int, default=1, help="seeds per prompt")
    ap.add_argument("--dump", type=Path, help="write every reply here (JSON), to read them")
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    defaults = site_defaults()
    site_label = "site defaults: " + ", ".join(f"{k}={v:g}" for k, v in defaults.items())
    settings = {"no penalties": {}, site_label: defaults}
    settings |= {text: sampling_fields(text) for text in args.setting}
    print(f"command: {' '.join(['python -m bench.quality', *sys.argv[1:]])}", flush=True)
    summaries: list[Summary] = []
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as logs:
        server = InferenceServer(
            Path(logs), engine="transformers", MAX_BATCH=CONCURRENCY, LOG_LEVEL="warning"
        ).start(timeout=600)
        try:
            for label, fields in settings.items():
                summaries.append(
                    Summary(label, asyncio.run(replies(server.url, fields, args.samples)))
                )
                print(summaries[-1].row(), flush=True)
        finally:
            server.stop()
    print(f"\n{HEADER}\n" + "\n".join(s.row() for s in summaries))
    print("\nran to the limit:\n" + "\n".join(at_limit(s) for s in summaries))
    if args.dump:
        args.dump.write_text(
            json.dumps({s.label: [vars(r) for r in s.replies] for s in summaries}, indent=1)
        )


if __name__ == "__main__":
    main()
