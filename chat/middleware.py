"""A Content-Security-Policy for the admin, where staff read every user's conversations:
should model or user text ever slip past escaping into a transcript, the browser still
runs no script that is not one of the site's own files."""

import functools

from django.urls import reverse

ADMIN_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        # Django's admin writes a few inline styles (the change list, our transcript);
        # styles cannot run code, scripts are what the policy is for.
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


@functools.cache
def _admin_prefix() -> str:
    return reverse("admin:index")


class AdminContentSecurityPolicy:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.path.startswith(_admin_prefix()):
            response.setdefault("Content-Security-Policy", ADMIN_POLICY)
        return response
