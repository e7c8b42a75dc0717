"""The sampling settings a conversation (or a preset) may set beyond temperature, top_p and
max_tokens, with their bounds and a one-line meaning each. The inference server implements
each with its reference meaning (docs/inference-api.md); here they are checked, saved, and
sent only when set, so a server that lacks one is never asked for it needlessly."""

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class Knob:
    name: str
    low: float
    high: float
    integer: bool
    setting: str  # the site-wide default's setting (None there: not sent)
    meaning: str


KNOBS = (
    Knob(
        "repetition_penalty",
        0.5,
        2.0,
        False,
        "CHAT_DEFAULT_REPETITION_PENALTY",
        "Above 1 makes any token already in the chat less likely (1: off).",
    ),
    Knob(
        "frequency_penalty",
        -2.0,
        2.0,
        False,
        "CHAT_DEFAULT_FREQUENCY_PENALTY",
        "Lowers a token the more often the reply has used it (0: off).",
    ),
    Knob(
        "presence_penalty",
        -2.0,
        2.0,
        False,
        "CHAT_DEFAULT_PRESENCE_PENALTY",
        "Lowers every token the reply has used at all, nudging to new words (0: off).",
    ),
    Knob(
        "top_k",
        0,
        1000,
        True,
        "CHAT_DEFAULT_TOP_K",
        "Samples only among the k likeliest tokens (0: off).",
    ),
    Knob(
        "min_p",
        0.0,
        1.0,
        False,
        "CHAT_DEFAULT_MIN_P",
        "Drops tokens less likely than this fraction of the likeliest one (0: off).",
    ),
)
NAMES = tuple(knob.name for knob in KNOBS)


def site_default(knob: Knob):
    return getattr(settings, knob.setting)
