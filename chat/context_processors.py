from django.conf import settings

from chat import sampling


def site_flags(request):
    return {
        "signup_enabled": settings.SIGNUP_ENABLED,
        "share_public": settings.SHARE_PUBLIC,
        "sampling_knobs": sampling.KNOBS,
        "sampling_defaults": ", ".join(
            f"{knob.name} {sampling.site_default(knob):g}"
            for knob in sampling.KNOBS
            if sampling.site_default(knob) is not None
        ),
    }
