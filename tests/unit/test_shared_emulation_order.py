"""The order emulation tests run in (tests/conftest.py): the modules sharing one emulation run one
after another, so that it is started once; nothing else moves."""
from support.fabrics import shared_runs_together


def order_of(shares: list[str | None]) -> list[str]:
    labels = [f"{i}:{s or '-'}" for i, s in enumerate(shares)]
    return [labels[i] for i in shared_runs_together(shares)]


def test_the_tests_of_one_shared_emulation_run_together_where_the_first_of_them_was():
    shares = [None, "mini-hpn", None, "x", "mini-hpn", None, "x"]
    assert order_of(shares) == ["0:-", "1:mini-hpn", "4:mini-hpn", "2:-", "3:x", "6:x", "5:-"]


def test_tests_that_share_nothing_keep_their_order():
    assert shared_runs_together([None] * 5) == [0, 1, 2, 3, 4]


def test_a_shared_emulations_tests_keep_their_own_order():
    shares = ["a", None, "a", "a", None]
    assert [i for i in shared_runs_together(shares) if shares[i] == "a"] == [0, 2, 3]
