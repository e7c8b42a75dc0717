"""Personal API keys: created, listed and revoked by their owner through the JSON API; the
secret shown once and stored hashed; a key opens /v1 and nothing else."""

import hashlib
import json

import pytest
from django.test import Client

from chat import keys
from chat.models import ApiKey
from tests.support.factories import create_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def user():
    return create_user()


@pytest.fixture
def api(user):
    client = Client()
    client.force_login(user)
    return client


def create(api, name="laptop script"):
    return api.post("/api/keys/", data=json.dumps({"name": name}), content_type="application/json")


def test_create_shows_the_secret_once_and_stores_only_its_hash(api, user):
    response = create(api)
    assert response.status_code == 201
    data = response.json()
    secret = data["key"]
    assert secret.startswith("ts-") and len(secret) >= 40
    assert data["prefix"] == secret[:11] and data["name"] == "laptop script"
    stored = ApiKey.objects.get(pk=data["id"])
    assert stored.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in json.dumps(list(ApiKey.objects.values()), default=str)
    listed = api.get("/api/keys/").json()["keys"]
    assert [k["id"] for k in listed] == [data["id"]]
    assert "key" not in listed[0] and listed[0]["last_used_at"] is None


def test_a_key_without_a_name_gets_one_and_unknown_fields_are_400(api):
    assert (
        api.post("/api/keys/", data="{}", content_type="application/json").json()["name"]
        == "API key"
    )
    bad = api.post(
        "/api/keys/",
        data=json.dumps({"name": "x", "scope": "all"}),
        content_type="application/json",
    )
    assert bad.status_code == 400
    assert create(api, name="n" * 101).status_code == 400


def test_revoke_removes_the_key_from_the_list_and_it_stops_working(api, user):
    data = create(api).json()
    assert keys.user_for_secret(data["key"]) == user
    assert api.delete(f"/api/keys/{data['id']}/").status_code == 204
    assert api.get("/api/keys/").json()["keys"] == []
    assert keys.user_for_secret(data["key"]) is None
    assert ApiKey.objects.get(pk=data["id"]).revoked_at is not None  # kept for staff
    assert api.delete(f"/api/keys/{data['id']}/").status_code == 404


def test_someone_elses_key_is_404(api):
    other = create_user()
    key, _ = keys.api_key_create(user=other, name="theirs")
    assert api.delete(f"/api/keys/{key.id}/").status_code == 404
    assert api.get("/api/keys/").json()["keys"] == []


def test_the_number_of_keys_is_capped(api, settings):
    settings.CHAT_MAX_API_KEYS_PER_USER = 2
    assert create(api).status_code == 201 and create(api).status_code == 201
    response = create(api)
    assert response.status_code == 400 and "Revoke one" in response.json()["error"]["message"]


def test_keys_need_a_signed_in_user():
    assert Client().get("/api/keys/").status_code == 401


def test_an_inactive_users_key_does_not_work(user):
    _, secret = keys.api_key_create(user=user, name="k")
    user.is_active = False
    user.save()
    assert keys.user_for_secret(secret) is None


def test_use_is_recorded_at_most_once_a_minute(user, django_assert_num_queries):
    key, secret = keys.api_key_create(user=user, name="k")
    with django_assert_num_queries(2):  # look-up, then last_used_at
        keys.user_for_secret(secret)
    with django_assert_num_queries(1):
        keys.user_for_secret(secret)
    key.refresh_from_db()
    assert key.last_used_at is not None


# --- what a key opens ----------------------------------------------------------------


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def test_a_key_opens_v1_without_session_or_csrf(user, settings, fresh_inference_client):
    settings.INFERENCE_CLIENT = "chat.inference_client.fake.FakeInferenceClient"
    _, secret = keys.api_key_create(user=user, name="k")
    client = Client(enforce_csrf_checks=True)
    response = client.get("/v1/models", headers=bearer(secret))
    assert response.status_code == 200
    assert response.json()["object"] == "list"
    assert response.json()["data"][0]["id"] == "fake-echo"
    assert "sessionid" not in response.cookies


def test_a_key_never_opens_the_page_the_json_api_or_the_admin(user):
    user.is_staff = user.is_superuser = True
    user.save()
    _, secret = keys.api_key_create(user=user, name="k")
    client = Client()
    assert client.get("/", headers=bearer(secret)).status_code == 302
    assert client.get("/api/conversations/", headers=bearer(secret)).status_code == 401
    assert client.get("/api/usage/", headers=bearer(secret)).status_code == 401
    assert client.get("/admin/", headers=bearer(secret)).status_code == 302
    assert client.get("/admin/usage/", headers=bearer(secret)).status_code == 302


def test_a_session_does_not_open_v1(api):
    response = api.get("/v1/models")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("header", ["Bearer ts-not-a-key", "Bearer ", "Basic dXNlcjpwdw==", ""])
def test_a_bad_or_missing_key_is_401_in_openais_shape(header):
    headers = {"Authorization": header} if header else {}
    response = Client().post(
        "/v1/chat/completions", data="{}", content_type="application/json", headers=headers
    )
    assert response.status_code == 401
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")


def test_a_revoked_key_is_401(user):
    key, secret = keys.api_key_create(user=user, name="k")
    keys.api_key_revoke(key=key)
    response = Client().get("/v1/models", headers=bearer(secret))
    assert response.status_code == 401 and "revoked" in response.json()["error"]["message"]
