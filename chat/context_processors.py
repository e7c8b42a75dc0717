from django.conf import settings


def site_flags(request):
    return {"signup_enabled": settings.SIGNUP_ENABLED, "share_public": settings.SHARE_PUBLIC}
