"""Number formats of the usage dashboard."""

from django import template

register = template.Library()

LABELS = {
    "prompt_tokens": "prompt",
    "completion_tokens": "completion",
    "completed": "completed",
    "cancellations": "cancelled",
    "failures": "failed",
}


@register.filter
def tokens(value) -> str:
    """12,345 below a million, then 1.2M: the dashboard compares sizes, not digits."""
    if value is None:
        return "–"
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    return f"{value:,}"


@register.filter
def ms(value) -> str:
    if value is None:
        return "–"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


@register.filter
def rate(value) -> str:
    return "–" if value is None else f"{value:.1f}"


@register.filter
def label(value) -> str:
    return LABELS.get(value, value)
