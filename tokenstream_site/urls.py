from django.contrib import admin
from django.urls import include, path

from chat import views
from chat.auth import sign_in, throttled_sign_in

# The admin's own sign-in form is a second door for password guesses: same brake.
admin.site.login = throttled_sign_in(admin.site.login)

urlpatterns = [
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", sign_in, name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", include("chat.urls")),
]
