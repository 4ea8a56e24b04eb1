"""The passes of `python3 dev.py test`: which tests the PostgreSQL pass selects, and the Redis databases each
pass and worker takes so that passes running at once share none."""

from __future__ import annotations

import textwrap

import pytest

from tests.processes import REPO, redis_databases

pytest_plugins = ["pytester"]

SAMPLE = '''
import pytest


@pytest.fixture
def store(db):
    return "store"


def test_plain():
    pass


def test_settings_only(settings):
    pass


def test_with_db(db):
    pass


def test_transactional(transactional_db):
    pass


def test_through_a_fixture(store):
    pass


def test_admin(admin_user):
    pass


@pytest.mark.django_db
def test_marked():
    pass


@pytest.mark.django_db(transaction=True)
class TestMarkedClass:
    def test_in_class(self):
        pass
'''

USING_THE_DATABASE = sorted(["test_with_db", "test_transactional", "test_through_a_fixture", "test_admin",
                             "test_marked", "TestMarkedClass::test_in_class"])


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makepyfile(test_sample=textwrap.dedent(SAMPLE))
    result = pytester.runpytest_inprocess("-p", "tests.conftest", "-o", "asyncio_default_fixture_loop_scope=function",
                                          "--collect-only", "-q", *args)
    return sorted(line.split("::", 1)[1] for line in result.outlines if line.startswith("test_sample.py::"))


def test_the_database_pass_selects_exactly_the_tests_that_use_the_test_database(pytester):
    assert collected(pytester, "--database-tests-only") == USING_THE_DATABASE


def test_without_the_option_every_test_is_selected(pytester):
    assert collected(pytester) == sorted(["test_plain", "test_settings_only", *USING_THE_DATABASE])


def test_an_evened_out_module_runs_in_the_database_pass_instead_of_the_sqlite_pass(pytester, monkeypatch):
    import tests.conftest

    monkeypatch.setattr(tests.conftest, "EVENED_OUT", ("test_sample.py::test_plain",))
    assert collected(pytester, "--database-tests-only") == sorted(["test_plain", *USING_THE_DATABASE])
    assert collected(pytester, "--not-evened-out") == sorted(["test_settings_only", *USING_THE_DATABASE])


def test_every_evened_out_module_exists_and_uses_no_test_database():
    from tests.conftest import EVENED_OUT

    for module in EVENED_OUT:
        source = (REPO / module).read_text(encoding="utf-8")  # a renamed module would run in neither pass's place
        assert "django_db" not in source and "transactional_db" not in source, module
        assert "playwright" not in source and "chromium" not in source, module  # would contend with the other pass's


@pytest.mark.parametrize(("worker", "expected"), [("", (11, 3, 4)), ("gw0", (11, 3, 4)), ("gw1", (12, 5, 6))])
def test_each_worker_takes_three_redis_databases_of_its_pass(worker, expected):
    assert redis_databases("11,3,4,12,5,6", worker) == expected


def test_a_worker_without_three_redis_databases_of_its_own_is_refused():
    with pytest.raises(ValueError, match="CHATFLOW_TEST_REDIS_DBS"):
        redis_databases("11,3,4,12", "gw1")
