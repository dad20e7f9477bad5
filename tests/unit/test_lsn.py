import pytest

from slotlake.lsn import Lsn


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0/0", 0),
        ("0/16B3748", 0x16B3748),
        ("16/B374D848", 0x16_B374D848),
        ("FFFFFFFF/FFFFFFFF", 2**64 - 1),
    ],
)
def test_parse_and_print_round_trip(text: str, value: int) -> None:
    lsn = Lsn(text)
    assert lsn == value
    assert str(lsn) == text
    assert Lsn(value) == lsn
    assert repr(lsn) == f"Lsn('{text}')"


@pytest.mark.parametrize("bad", ["", "0", "0/", "/1", "G/1", "1/2/3", "123456789/0"])
def test_rejects_malformed_text(bad: str) -> None:
    with pytest.raises(ValueError, match="not an LSN"):
        Lsn.parse(bad)


def test_range_and_signed_storage() -> None:
    with pytest.raises(ValueError):
        Lsn(-1)
    with pytest.raises(ValueError):
        Lsn(2**64)
    top = Lsn("FFFFFFFF/FFFFFFFF")
    assert top.to_signed() == -1
    assert Lsn.from_signed(-1) == top
    assert Lsn.from_signed(Lsn("1/0").to_signed()) == Lsn("1/0")
    assert Lsn("0/10") - Lsn("0/1") == 15
