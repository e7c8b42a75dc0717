"""Sign-in with a brake on password guessing: after LOGIN_MAX_FAILURES failed attempts on
one username within LOGIN_LOCKOUT_SECONDS, further attempts get 429. One address gets ten
times that, so a guesser spreading over usernames is slowed, while colleagues behind one
proxy or NAT are not locked out by a single forgetful user."""

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.core.cache import cache


def _keys(request) -> list[str]:
    username = (request.POST.get("username") or "").strip().lower()[:150]
    address = request.META.get("REMOTE_ADDR", "")
    return [f"login-fail:user:{username}", f"login-fail:addr:{address}"]


def _over_limit(request) -> bool:
    user_key, address_key = _keys(request)
    limit = settings.LOGIN_MAX_FAILURES
    return cache.get(user_key, 0) >= limit or cache.get(address_key, 0) >= limit * 10


class ThrottledLoginView(LoginView):
    def post(self, request, *args, **kwargs):
        if _over_limit(request):
            form = self.get_form()
            minutes = max(1, settings.LOGIN_LOCKOUT_SECONDS // 60)
            form.errors.clear()
            form.add_error(
                None, f"Too many failed sign-ins. Wait {minutes} minutes and try again."
            )
            return self.render_to_response(self.get_context_data(form=form), status=429)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        for key in _keys(self.request):
            cache.add(key, 0, settings.LOGIN_LOCKOUT_SECONDS)
            cache.incr(key)
        return super().form_invalid(form)

    def form_valid(self, form):
        cache.delete(_keys(self.request)[0])
        return super().form_valid(form)
