import pytest

from slotlake.redact import describe_dsn, dsn_password, redact_dsn, redact_text


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("host=db port=5432 user=app", "host=db port=5432 user=app"),
        ("host=db password=s3cret user=app", "host=db password=*** user=app"),
        ("host=db password = s3cret user=app", "host=db password = *** user=app"),
        ("host=db password='s3 cr\\'et' user=app", "host=db password=*** user=app"),
        ("password=s3cret", "password=***"),
        ("host=db PASSWORD=s3cret", "host=db PASSWORD=***"),
        ("postgresql://app:s3cret@db:5432/src", "postgresql://app:***@db:5432/src"),
        (
            "postgres://app:s3cret@db/src?sslmode=require",
            "postgres://app:***@db/src?sslmode=require",
        ),
        ("postgresql://app@db/src", "postgresql://app@db/src"),
        (
            "postgresql://db/src?password=s3cret&sslmode=require",
            "postgresql://db/src?password=***&sslmode=require",
        ),
        (
            "postgresql://app:s3cret@db1:5432,db2:5432/src?application_name=x&password=other",
            "postgresql://app:***@db1:5432,db2:5432/src?application_name=x&password=***",
        ),
    ],
)
def test_redact_dsn(dsn: str, expected: str) -> None:
    assert redact_dsn(dsn) == expected
    assert "s3cret" not in redact_dsn(dsn)


def test_redact_text_masks_given_secrets_and_embedded_dsns() -> None:
    text = (
        'connection to "host=db password=hunter2 user=x" failed; also tried '
        "postgresql://x:pa55@db/y and the secret Tr0ub4dor appeared verbatim"
    )
    out = redact_text(text, secrets=["Tr0ub4dor", ""])
    for secret in ("hunter2", "pa55", "Tr0ub4dor"):
        assert secret not in out
    assert "connection to" in out and "failed" in out


def test_redact_text_masks_url_encoded_secret() -> None:
    out = redact_text("postgresql://x:p%40ss%20w@db/y?x=p%40ss%20w", secrets=["p@ss w"])
    assert "p%40ss" not in out and "p@ss" not in out


def test_redact_text_masks_pgpassword(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "fromenv123")
    assert "fromenv123" not in redact_text("server said: fromenv123 is wrong")


def test_redact_text_leaves_ordinary_text_alone() -> None:
    text = "replication slot 's' does not exist (SQLSTATE 42704)"
    assert redact_text(text) == text


def test_dsn_password() -> None:
    assert dsn_password("host=db password=abc") == "abc"
    assert dsn_password("postgresql://u:abc@db/x") == "abc"
    assert dsn_password("host=db") is None
    assert dsn_password("this is = not a dsn '") is None


def test_describe_dsn_names_an_empty_dsn_and_redacts_others() -> None:
    assert describe_dsn("host=db password=abc") == "host=db password=***"
    for empty in ("", "  "):
        assert describe_dsn(empty).startswith("the libpq defaults (an empty source.dsn")
