"""The console's pages over plain HTTP (no browser): headers that keep them out of frames and
scripts out of them, names escaped, errors in words, and the API page served without a CDN."""

import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
from _server import Server

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server(fitted, tmp_path_factory):
    with Server.serving(fitted, tmp_path_factory.mktemp("pages")) as srv:
        yield srv


def get(server, path):
    try:
        with urllib.request.urlopen(server.url + path, timeout=60) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def test_pages_are_framed_by_nobody_and_escape_what_users_wrote(server):
    name = '<script>alert("x")'
    assert server.call("POST", "/labels", {"name": name, "examples": ['<img src=x onerror="alert(1)">']})[0] == 201
    for path in ("/", "/console/labels/" + quote(name, safe=""), "/console/versions",
                 "/console/versions/diff?a=1&b=2", "/console/try", "/console/inbox"):
        status, headers, html = get(server, path)
        assert status == 200, path
        assert "frame-ancestors 'none'" in headers["content-security-policy"] and "script-src 'self'" in \
            headers["content-security-policy"] and headers["x-frame-options"] == "DENY"
        assert headers["cache-control"] == "no-store" and "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert" in get(server, "/")[2]


def test_errors_are_pages_in_words(server):
    status, _, html = get(server, "/console/labels/nope")
    assert status == 404 and "label &#39;nope&#39; does not exist" in html
    status, _, html = get(server, "/console/versions/diff?a=1&b=99")
    assert status == 400 and "no version 99 in this store" in html
    status, _, html = get(server, "/?page=x")
    assert status == 400 and "page must be a whole number" in html


def test_the_api_page_loads_nothing_from_another_host(server):
    status, _, html = get(server, "/docs")
    assert status == 200 and "/docs/static/swagger-ui-bundle.js" in html and "/docs/static/swagger-ui.css" in html
    assert "http://" not in html.replace(server.url, "") and "https://" not in html
    assert get(server, "/docs/static/swagger-ui-bundle.js")[0] == 200
    assert get(server, "/openapi.json")[0] == 200
