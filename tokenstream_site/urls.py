from django.contrib import admin
from django.urls import include, path

from chat import views

urlpatterns = [
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", include("chat.urls")),
]
