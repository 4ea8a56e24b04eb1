"""The passes of `python3 dev.py test`: which tests each pass selects (every test that uses Django's test
database, and a share of the others, each in exactly one pass), and the Redis databases each pass and worker
takes so that passes running at once share none."""

from __future__ import annotations

import textwrap

import pytest

import dev
from tests import shares
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


def run_collect_only(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess("-p", "tests.conftest", "-o", "asyncio_default_fixture_loop_scope=function",
                                        "--collect-only", "-q", *args)


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makepyfile(test_sample=textwrap.dedent(SAMPLE))
    result = run_collect_only(pytester, *args)
    return sorted(line.split("::", 1)[1] for line in result.outlines if line.startswith("test_sample.py::"))


SAMPLE_MODULES = [f"test_module_{index}" for index in range(12)]


def collected_ids(pytester: pytest.Pytester, *args: str) -> set[str]:
    """Test ids of twelve copies of SAMPLE (modules not in the weight file: their share comes from the path)."""
    pytester.makepyfile(**{name: textwrap.dedent(SAMPLE) for name in SAMPLE_MODULES})
    return {line for line in run_collect_only(pytester, *args).outlines if line.startswith("test_module_")}


def test_the_database_pass_selects_exactly_the_tests_that_use_the_test_database(pytester):
    assert collected(pytester, "--database-tests-only") == USING_THE_DATABASE


def test_without_the_option_every_test_is_selected(pytester):
    assert collected(pytester) == sorted(["test_plain", "test_settings_only", *USING_THE_DATABASE])


def test_dev_pys_passes_run_every_test_that_does_not_use_the_database_exactly_once(pytester):
    every = collected_ids(pytester)
    by_pass = [collected_ids(pytester, *one.options) for one in dev.passes()]
    using_the_database = {f"{module}.py::{name}" for module in SAMPLE_MODULES for name in USING_THE_DATABASE}
    assert using_the_database < every
    for selected in by_pass:
        assert using_the_database <= selected  # every pass runs every test that uses the database
    others = [selected - using_the_database for selected in by_pass]
    assert all(others)  # each pass runs some of the others
    assert set.union(*others) == every - using_the_database
    assert sum(map(len, others)) == len(every - using_the_database)  # none in two passes


def test_dev_pys_shares_are_each_share_once():
    parsed = [shares.parse_share(share) for share in dev.NON_DATABASE_SHARES]
    count = parsed[0][1]
    assert all(total == count for _, total in parsed)
    taken = [number for numbers, _ in parsed for number in numbers]
    assert sorted(taken) == list(range(1, count + 1))


def suite_modules() -> list[str]:
    return sorted(path.relative_to(REPO).as_posix() for path in (REPO / "tests").rglob("test_*.py")
                  if "vendor" not in path.parts)


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_every_test_module_has_one_share_of_n(count):
    dealt = shares.deal(shares.load_weights(), count)
    assert {shares.share_of(module, count, dealt) for module in suite_modules()} <= set(range(1, count + 1))


def test_every_test_module_of_the_suite_lands_in_exactly_one_pass():
    parsed = [shares.parse_share(share) for share in dev.NON_DATABASE_SHARES]
    count = parsed[0][1]
    dealt = shares.deal(shares.load_weights(), count)
    modules = suite_modules()
    assert len(modules) > 50 and set(shares.load_weights()) <= set(modules)
    for module in modules:
        share = shares.share_of(module, count, dealt)
        assert sum(share in taken for taken, _ in parsed) == 1, module


def test_the_weight_file_names_only_test_modules_of_the_suite():
    assert all((REPO / module).is_file() for module in shares.load_weights())


def test_the_listed_modules_are_dealt_into_shares_of_about_equal_weight():
    weights = shares.load_weights()
    dealt = shares.deal(weights, 5)
    loads = [sum(weight for module, weight in weights.items() if dealt[module] == k) for k in range(1, 6)]
    assert max(loads) - min(loads) <= max(weights.values())  # the greedy rule's bound


def test_the_share_of_a_module_depends_only_on_its_path_and_the_weights():
    weights = {"tests/a.py": 5.0, "tests/b.py": 3.0, "tests/c.py": 3.0, "tests/d.py": 1.0}
    assert shares.deal(weights, 2) == {"tests/a.py": 1, "tests/b.py": 2, "tests/c.py": 2, "tests/d.py": 1}
    assert shares.deal(dict(reversed(weights.items())), 2) == shares.deal(weights, 2)
    unlisted = shares.share_of("tests/new.py", 3, {})
    assert 1 <= unlisted <= 3 and shares.share_of("tests/new.py", 3, {}) == unlisted


@pytest.mark.parametrize(("text", "expected"), [("1/2", ({1}, 2)), ("1,2,3/5", ({1, 2, 3}, 5)), ("4,5/5", ({4, 5}, 5))])
def test_a_share_is_k_of_n(text, expected):
    assert shares.parse_share(text) == expected


@pytest.mark.parametrize("text", ["", "1", "0/2", "3/2", "a/2", "1/0", "1,,2/3"])
def test_a_share_outside_one_to_n_is_a_usage_error(pytester, text):
    pytester.makepyfile(test_sample=textwrap.dedent(SAMPLE))
    result = run_collect_only(pytester, f"--non-database-share={text}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--non-database-share=*"])


@pytest.mark.parametrize(("worker", "expected"), [("", (11, 3, 4)), ("gw0", (11, 3, 4)), ("gw1", (12, 5, 6))])
def test_each_worker_takes_three_redis_databases_of_its_pass(worker, expected):
    assert redis_databases("11,3,4,12,5,6", worker) == expected


def test_a_worker_without_three_redis_databases_of_its_own_is_refused():
    with pytest.raises(ValueError, match="CHATFLOW_TEST_REDIS_DBS"):
        redis_databases("11,3,4,12", "gw1")
