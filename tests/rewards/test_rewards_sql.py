"""The sql reward on a small SQLite database built here: execution match, order rules, read-only, limits."""

import hashlib
import sqlite3

import pytest

from conftest import make_rollout
from rewardlab.rewards import REWARDS, build_reward
from rewardlab.rewards.sql import SQLReward, extract_sql, has_top_level_order_by, open_read_only
from rewardlab.types import Rollout

EMPLOYEES = [  # id, name, dept, salary
    (1, "Ada", "eng", 120), (2, "Bob", "eng", 90), (3, "Cy", "ops", 70), (4, "Di", "ops", 70), (5, "Ed", "hr", 50),
]


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "company.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT, dept TEXT, salary INTEGER)")
    conn.executemany("INSERT INTO employees VALUES (?, ?, ?, ?)", EMPLOYEES)
    conn.commit()
    conn.close()
    return path


def _score(db, completion, reference, **options):
    (out,) = SQLReward(db_path=str(db), **options)([make_rollout(completion, {"answer": reference})])
    assert out.error is None, out.error
    return out


def _flags(out):
    return {k for k, v in out.components.items() if v == 1.0}


# ---------------------------------------------------------------- execution match
def test_same_rows_from_a_different_query_score_1(db):
    out = _score(db, "SELECT name FROM employees WHERE NOT salary <= 80",
                 "SELECT name FROM employees WHERE salary > 80")  # both: Ada, Bob
    assert out.score == 1.0 and _flags(out) == {"correct", "parses", "executes"}


def test_row_order_is_ignored_without_a_top_level_order_by(db):
    assert _score(db, "SELECT name FROM employees ORDER BY name DESC", "SELECT name FROM employees").score == 1.0


def test_row_order_counts_when_the_reference_orders(db):
    reference = "SELECT name FROM employees ORDER BY salary DESC, name"  # Ada, Bob, Cy, Di, Ed
    assert _score(db, "SELECT name FROM employees ORDER BY salary DESC, name", reference).score == 1.0
    assert _score(db, "SELECT name FROM employees ORDER BY salary, name", reference).score == 0.0  # reversed
    assert _score(db, "SELECT name FROM employees ORDER BY name DESC", reference).score == 0.0  # Ed, Di, Cy, ...


def test_duplicates_count_in_the_multiset(db):
    # dept column: eng, eng, ops, ops, hr vs DISTINCT: eng, ops, hr - same set, different multiset
    out = _score(db, "SELECT DISTINCT dept FROM employees", "SELECT dept FROM employees")
    assert out.score == 0.0 and _flags(out) == {"parses", "executes"}


def test_wrong_values_and_column_order(db):
    assert _score(db, "SELECT name FROM employees WHERE salary > 60", "SELECT name FROM employees WHERE salary > 80"
                  ).score == 0.0
    assert _score(db, "SELECT salary, name FROM employees", "SELECT name, salary FROM employees").score == 0.0
    assert _score(db, "SELECT name AS n FROM employees", "SELECT name FROM employees").score == 1.0  # names ignored


# ---------------------------------------------------------------- bad SQL is a 0 with a reason, not an error
@pytest.mark.parametrize("completion, flags", [
    ("SELEC name FROM employees", set()),  # syntax error
    ("SELECT name FROM", set()),  # incomplete input
    ("SELECT nope FROM employees", {"parses"}),  # parses, fails to run
    ("SELECT name FROM missing_table", {"parses"}),
    ("", set()),  # blank
])
def test_bad_sql_scores_0_with_flags(db, completion, flags):
    out = _score(db, completion, "SELECT name FROM employees")
    assert out.score == 0.0 and _flags(out) == flags


# ---------------------------------------------------------------- read-only
WRITES = [
    "DELETE FROM employees",
    "UPDATE employees SET salary = 0",
    "INSERT INTO employees VALUES (6, 'Eve', 'eng', 1)",
    "DROP TABLE employees",
    "CREATE TABLE t (x)",
    "PRAGMA writable_schema = 1",
    "SELECT 1; DELETE FROM employees",  # a second statement
]


def test_writes_are_denied_and_the_database_is_unchanged(db, tmp_path):
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    attach = f"ATTACH DATABASE '{tmp_path / 'new.sqlite'}' AS other"
    count = {"answer": "SELECT count(*) FROM employees"}
    outs = SQLReward(db_path=str(db))([make_rollout(q, count) for q in WRITES + [attach]])
    for query, out in zip(WRITES + [attach], outs):
        assert out.error is None and out.score == 0.0, query
        assert _flags(out) == {"parses", "denied"}, query
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert not (tmp_path / "new.sqlite").exists()  # ATTACH would have created it
    assert sqlite3.connect(db).execute("SELECT count(*) FROM employees").fetchone() == (5,)


def test_the_connection_itself_is_read_only_without_the_authorizer(db):
    conn = open_read_only(str(db))
    conn.set_authorizer(None)  # remove two of the three guards: the mode=ro URI alone still refuses
    conn.execute("PRAGMA query_only = OFF")
    with pytest.raises(sqlite3.OperationalError, match="attempt to write a readonly database"):
        conn.execute("DELETE FROM employees")
    conn.close()


# ---------------------------------------------------------------- limits
def test_a_query_past_the_time_limit_is_interrupted(db):
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    out = _score(db, endless, "SELECT 1", timeout=0.3)
    assert out.score == 0.0 and _flags(out) == {"parses", "timed_out"}


def test_too_many_rows(db):
    out = _score(db, "SELECT * FROM employees", "SELECT 1", max_rows=3)  # 5 rows > 3
    assert out.score == 0.0 and _flags(out) == {"parses", "too_many_rows"}


# ---------------------------------------------------------------- inputs
def test_extract_sql():
    assert extract_sql("Here:\n```sql\nSELECT 1\n```\nand\n```sql\nSELECT 2;\n```") == "SELECT 2;"
    assert extract_sql("<answer> SELECT 3 </answer>") == "SELECT 3"
    assert extract_sql("  SELECT 4\n") == "SELECT 4"


@pytest.mark.parametrize("sql, ordered", [
    ("SELECT a FROM t ORDER BY a", True),
    ("select a from t order\n  by a desc", True),
    ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),  # orders the whole compound
    ("SELECT * FROM (SELECT a FROM t ORDER BY a)", False),  # subquery only
    ("SELECT a, rank() OVER (ORDER BY a) FROM t", False),  # window
    ("SELECT 'order by' FROM t", False),  # string literal
    ('SELECT "order by" FROM t', False),  # quoted name
    ("SELECT a FROM t -- ORDER BY a", False),  # comment
    ("SELECT a FROM t /* ORDER BY a */", False),
])
def test_has_top_level_order_by(sql, ordered):
    assert has_top_level_order_by(sql) is ordered


def test_db_path_from_the_row_and_db_dir(db):
    reward = REWARDS["sql"]()
    fenced = "```sql\nSELECT count(*) FROM employees\n```"
    (out,) = reward([make_rollout(fenced, {"answer": "SELECT 5", "db_path": str(db)})])
    assert out.score == 1.0
    row = {"answer": "SELECT 5", "db_path": db.name}
    (out,) = REWARDS["sql"](db_dir=str(db.parent))([make_rollout("SELECT 5", row)])
    assert out.score == 1.0


def test_errors_are_for_the_setup_not_the_prediction(db, tmp_path):
    reward = SQLReward()
    (no_db,) = reward([make_rollout("SELECT 1", {"answer": "SELECT 1"})])
    assert no_db.error == "sql: no database: give the db_path option or a 'db_path' row field"
    (missing,) = reward([make_rollout("SELECT 1", {"answer": "SELECT 1", "db_path": str(tmp_path / "nope.sqlite")})])
    assert missing.error.startswith(f"sql: cannot open database '{tmp_path / 'nope.sqlite'}'")
    (bad_ref,) = reward([make_rollout("SELECT 1", {"answer": "SELECT * FROM nope", "db_path": str(db)})])
    assert bad_ref.error == "sql: reference query failed: no such table: nope" and bad_ref.score == 0.0
    (no_answer,) = SQLReward(db_path=str(db))([Rollout("p", [1], "SELECT 1", [5], [0.0])])
    assert no_answer.error == "sql: row has no 'answer'"


def test_built_from_config(db):
    built = build_reward([{"name": "sql", "db_path": str(db), "timeout": 2.0, "weight": 1.0}])
    (out,) = built([make_rollout("SELECT max(salary) FROM employees", {"answer": "SELECT 120"})])
    assert out.score == 1.0 and out.components["parses"] == 1.0
    with pytest.raises(ValueError, match=r"rewards\[0\] \(sql\): timeout"):
        build_reward([{"name": "sql", "timeout": 0}])
