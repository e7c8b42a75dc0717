"""The admin's side of usage: the staff dashboard at /admin/usage/ (with its CSV and the
live server states it polls), token quota overrides on users and groups, API keys (staff
can see and revoke them, never read them), and the UsageDay rows themselves."""

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.http import HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from chat import dashboard, keys
from chat.models import ApiKey, TokenQuota, UsageDay

User = get_user_model()


# --- the dashboard (routed in tokenstream_site/urls.py, behind admin_view: staff only) --


def dashboard_view(request):
    window = dashboard.usage_window()
    context = {
        **admin.site.each_context(request),
        "title": "Usage",
        "window": window,
        "tokens_chart": dashboard.chart(window["days"], ("prompt_tokens", "completion_tokens")),
        "replies_chart": dashboard.chart(
            window["days"], ("completed", "cancellations", "failures")
        ),
        "server_urls": [url.rstrip("/") for url in settings.INFERENCE_URLS],
    }
    return TemplateResponse(request, "admin/usage/dashboard.html", context)


def csv_view(request):
    window = dashboard.usage_window()
    response = HttpResponse(dashboard.usage_csv(window), content_type="text/csv; charset=utf-8")
    name = f"tokenstream-usage-{window['start']}-to-{window['today']}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def servers_view(request):
    """What the dashboard polls for the servers' live state."""
    return JsonResponse(
        {
            "servers": async_to_sync(dashboard.server_states)(),
            "checked_at": timezone.now().isoformat(),
        }
    )


# --- quotas on users and groups --------------------------------------------------------


class TokenQuotaInline(admin.StackedInline):
    model = TokenQuota
    fields = ("daily_tokens", "monthly_tokens")
    can_delete = True
    extra = 0
    max_num = 1
    verbose_name = "token quota override"
    verbose_name_plural = "token quota override"


class ApiKeyInline(admin.TabularInline):
    """Seen from the user: which keys exist and when they were last used."""

    model = ApiKey
    fields = ("name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class UserWithUsageAdmin(UserAdmin):
    inlines = [*UserAdmin.inlines, TokenQuotaInline, ApiKeyInline]


@admin.register(Group)
class GroupWithQuotaAdmin(GroupAdmin):
    inlines = [*GroupAdmin.inlines, TokenQuotaInline]


@admin.register(TokenQuota)
class TokenQuotaAdmin(admin.ModelAdmin):
    list_display = ("__str__", "user", "group", "daily_tokens", "monthly_tokens")
    list_select_related = ("user", "group")
    raw_id_fields = ("user",)
    search_fields = ("user__username", "group__name")


# --- API keys ------------------------------------------------------------------------


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "created_at")
    search_fields = ("user__username", "name", "prefix")
    list_select_related = ("user",)
    readonly_fields = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    exclude = ("key_hash",)
    actions = ("revoke",)

    def has_add_permission(self, request):
        return False  # keys are created by their owner, who alone sees the secret

    def has_change_permission(self, request, obj=None):
        return False

    def has_revoke_permission(self, request):
        return request.user.has_perm("chat.change_apikey")

    @admin.action(description="Revoke selected API keys", permissions=["revoke"])
    def revoke(self, request, queryset):
        for key in queryset:
            keys.api_key_revoke(key=key)


# --- the rows behind the dashboard ---------------------------------------------------


@admin.register(UsageDay)
class UsageDayAdmin(admin.ModelAdmin):
    change_list_template = "admin/usage/usageday_change_list.html"
    list_display = (
        "day",
        "user",
        "model",
        "source",
        "prompt_tokens",
        "completion_tokens",
        "replies",
        "failures",
        "cancellations",
    )
    list_filter = ("source", "model", ("day", admin.DateFieldListFilter))
    search_fields = ("user__username", "model")
    list_select_related = ("user",)
    date_hierarchy = "day"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
