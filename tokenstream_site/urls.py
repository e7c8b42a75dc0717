from django.contrib import admin
from django.urls import include, path

from chat import admin_usage, views
from chat.auth import sign_in, throttled_sign_in

# The admin's own sign-in form is a second door for password guesses: same brake.
admin.site.login = throttled_sign_in(admin.site.login)

urlpatterns = [
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", sign_in, name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    # The staff usage dashboard; admin_view: signed-in staff only, others go to sign in.
    path("admin/usage/", admin.site.admin_view(admin_usage.dashboard_view), name="admin-usage"),
    path(
        "admin/usage/usage.csv", admin.site.admin_view(admin_usage.csv_view), name="admin-usage-csv"
    ),
    path(
        "admin/usage/servers.json",
        admin.site.admin_view(admin_usage.servers_view),
        name="admin-usage-servers",
    ),
    path("admin/", admin.site.urls),
    path("", include("chat.urls")),
]
