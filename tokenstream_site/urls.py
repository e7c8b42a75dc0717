from django.contrib import admin
from django.urls import include, path

from chat import views
from chat.auth import ThrottledLoginView

urlpatterns = [
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", include("chat.urls")),
]
