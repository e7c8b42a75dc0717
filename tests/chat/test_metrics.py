"""Both /metrics endpoints speak the Prometheus text format, and the site's is not public."""

import httpx
import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families


def metric_names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


@pytest.mark.django_db
def test_site_metrics_parse_as_prometheus_text_for_staff(make_user):
    client = Client()
    client.force_login(make_user(staff=True))

    response = client.get("/metrics")

    assert response.status_code == 200
    names = metric_names(response.content.decode())
    assert {"tokenstream_relays_active", "tokenstream_token_events"} <= names


@pytest.mark.django_db
def test_site_metrics_refuse_anonymous_and_non_staff_users(client, make_user):
    assert client.get("/metrics").status_code == 403
    client.force_login(make_user())
    assert client.get("/metrics").status_code == 403


@pytest.mark.django_db
def test_site_metrics_accept_the_scrapers_bearer_token(client, settings):
    settings.METRICS_TOKEN = "scrape-me"
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
    response = client.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
    assert response.status_code == 200 and metric_names(response.content.decode())


@pytest.mark.django_db
def test_the_scrapers_token_is_compared_in_constant_time(client, settings, monkeypatch):
    from django.utils.crypto import constant_time_compare

    from chat import views

    settings.METRICS_TOKEN = "scrape-me"
    compared = []

    def spy(a, b):
        compared.append((a, b))
        return constant_time_compare(a, b)

    monkeypatch.setattr(views, "constant_time_compare", spy)
    assert client.get("/metrics", headers={"Authorization": "Bearer scrape-mf"}).status_code == 403
    assert len(compared) == 1 and "scrape-mf" in compared[0][0] + compared[0][1]
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer sçrape-me").status_code == 403


@pytest.mark.live
def test_inference_metrics_parse_as_prometheus_text(running_inference):
    response = httpx.get(f"{running_inference.url}/metrics", timeout=10)

    assert response.status_code == 200
    names = metric_names(response.text)
    assert "inference_requests" in names and "inference_generated_tokens" in names
