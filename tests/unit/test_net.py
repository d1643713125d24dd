"""The one parser each of listen addresses, bearer tokens and URL ports that the operator and
the model bridge share (``evalkube.util.net``)."""

from __future__ import annotations

import pytest

from evalkube.util.net import bearer_token, parse_listen, url_port


def test_listen_address_forms() -> None:
    assert parse_listen("unix:/run/x.sock") == "/run/x.sock"
    assert parse_listen("0.0.0.0:8080") == ("0.0.0.0", 8080)
    assert parse_listen("http://localhost:9/") == ("localhost", 9)
    assert parse_listen("[::1]:7") == ("::1", 7)
    # the operator's ":8080" means every interface, the bridge's loopback
    assert parse_listen(":8080", default_host="0.0.0.0") == ("0.0.0.0", 8080)
    assert parse_listen(":8080") == ("127.0.0.1", 8080)


@pytest.mark.parametrize("value", ["somewhere", "h:99999", "h:port", "a:b:c", "[::1]"])
def test_a_bad_listen_address_is_named_with_the_forms_that_work(value: str) -> None:
    with pytest.raises(ValueError, match=r"neither unix:/path nor host:port \(e\.g\. "):
        parse_listen(value)


def test_an_empty_unix_path_says_what_to_give() -> None:
    with pytest.raises(ValueError, match="needs a path"):
        parse_listen("unix:")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("Bearer ", None),
        ("Bearer", None),
        ("bearer abc", None),
        ("Basic abc", None),
        ("abc", None),
        ("", None),
    ],
)
def test_bearer_token(header: str, token: str | None) -> None:
    assert bearer_token({"Authorization": header}) == token
    assert bearer_token({}) is None


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("https://api.openai.com/v1", 443),
        ("http://fake.local/v1", 80),
        ("http://10.0.0.1:8000/v1", 8000),
        ("http://[fd00::1]:3128", 3128),
        ("https://[fd00::1]/v1", 443),
    ],
)
def test_url_port(url: str, port: int) -> None:
    assert url_port(url) == port
