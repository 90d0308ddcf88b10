"""The results database, run against SQLite and PostgreSQL (``-m postgres`` needs DEPLOY_ADVISOR_PG_URL).

Round trips of every stored type, guarded state transitions, idempotency, all-or-nothing finishing, the
query functions against answers computed here independently, and the named-query registry.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import db
from db import (
    NAMED_QUERIES,
    Database,
    IllegalTransition,
    QueryError,
    UnknownStudy,
    UnknownTrial,
    connect,
    queries,
)
from search_spaces import (
    SLO,
    All2AllBackend,
    DeploymentConfig,
    EPLBConfig,
    Measurement,
    Mode,
    Role,
    RoleConfig,
    TrialState,
)

REPO = Path(__file__).resolve().parents[1]
STUDY = "dsr1-8xh200"


# ---------------------------------------------------------------------------------------------- backends


def _libpq(url: str) -> str:
    """The URL psycopg itself takes (no ``+psycopg`` driver suffix)."""
    return db.normalize_url(url).replace("postgresql+psycopg://", "postgresql://", 1)


def _fresh_pg_database(base_url: str) -> Iterator[str]:
    """A database of its own for one test (dropped afterwards); without CREATEDB, the base database with our
    tables dropped first."""
    import psycopg
    from sqlalchemy import make_url

    base = make_url(db.normalize_url(base_url))
    name = f"advisor_t_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(_libpq(base_url), autocommit=True) as conn:
            fast = " STRATEGY = FILE_COPY" if conn.info.server_version >= 150000 else ""  # WAL_LOG: ~5× slower
            conn.execute(f'CREATE DATABASE "{name}"{fast}')
    except psycopg.errors.InsufficientPrivilege:
        with psycopg.connect(_libpq(base_url), autocommit=True) as conn:
            conn.execute(
                "DROP TABLE IF EXISTS advisor_exports, advisor_measurements, advisor_trials, advisor_studies, "
                "advisor_alembic_version CASCADE"
            )
        yield base.render_as_string(hide_password=False)
        return
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        # FORCE ends the test's own connections; a process of another role (an autovacuum worker — scripts/pg_start.sh
        # turns autovacuum off, another server may not) cannot be ended by the test role: wait for it instead
        for attempt in range(10):
            try:
                with psycopg.connect(_libpq(base_url), autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                break
            except psycopg.errors.InsufficientPrivilege:
                if attempt == 9:
                    raise
                time.sleep(1.0)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database of each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'runs' / 'advisor.db'}"
    else:
        yield from _fresh_pg_database(request.getfixturevalue("pg_url"))


@pytest.fixture
def database(url: str) -> Iterator[Database]:
    d = connect(url)
    d.upsert_study(STUDY, {"model": "deepseek-r1", "slos": ["p90_ttft_ms <= 2000"]}, executor="simulated")
    yield d
    d.close()


# ---------------------------------------------------------------------------------------------- sample values


def disaggregated() -> DeploymentConfig:
    return DeploymentConfig(
        mode=Mode.DISAGGREGATED,
        prefill=RoleConfig(
            role=Role.PREFILL, instances=2, data_parallel_size=2, enable_expert_parallel=True,
            max_num_batched_tokens=16384, all2all_backend=All2AllBackend.DEEPEP_HIGH_THROUGHPUT, enable_dbo=True,
        ),
        decode=RoleConfig(
            role=Role.DECODE, data_parallel_size=8, enable_expert_parallel=True, max_num_seqs=512,
            all2all_backend=All2AllBackend.DEEPEP_LOW_LATENCY,
            eplb=EPLBConfig(enabled=True, num_redundant_experts=32, window_size=500, step_interval=2000),
        ),
        kv_connector="NixlConnector",
        router_policy="power_of_two",
        speculative_mtp_tokens=1,
    )


def aggregated(tp: int = 4) -> DeploymentConfig:
    return DeploymentConfig(mode=Mode.AGGREGATED, decode=RoleConfig(role=Role.MIXED, tensor_parallel_size=tp))


def full_measurement(concurrency: int = 32) -> Measurement:
    """Every field set to a distinct value (floats with non-terminating binary expansions)."""
    values: dict[str, object] = {}
    for i, (name, f) in enumerate(Measurement.model_fields.items()):
        ann = str(f.annotation)
        if name == "raw":
            values[name] = {"per_request": [{"ttft": 0.1, "ok": True}, {"ttft": None, "error": "timeout"}],
                            "server": {"rank0": 1.5}, "note": "ü"}
        elif name == "source":
            values[name] = "measured"
        elif name == "concurrency":
            values[name] = concurrency
        elif name == "request_rate":
            values[name] = None  # a concurrency level
        elif name == "purpose":
            values[name] = "knee"
        elif name == "intervals":
            values[name] = {"p90_ttft_ms": [i + 0.25, i + 1 / 3]}
        elif name == "flags":
            values[name] = ["remeasured", "prefix-cache-reuse"]
        elif name == "expert_routing":
            values[name] = "zipf 1.1"
        elif "bool" in ann:
            values[name] = True
        elif "int" in ann:
            values[name] = 1000 + i
        else:
            values[name] = i + 1 / 3
    return Measurement.model_validate(values)


def sparse_measurement(concurrency: int = 8) -> Measurement:
    """Only what is required: every optional metric is None (no data, not 0)."""
    return Measurement(concurrency=concurrency, source="simulated", gpus=8, num_requests=80, completed=0, failed=80)


def _sql_count(d: Database, table: str) -> int:
    from sqlalchemy import text

    with d._read() as s:
        return int(s.scalar(text(f"SELECT count(*) FROM {table}")))  # noqa: S608 - fixed table names


# ---------------------------------------------------------------------------------------------- connecting


def test_normalize_url() -> None:
    assert db.normalize_url("postgresql://u:p@h:5432/d") == "postgresql+psycopg://u:p@h:5432/d"
    assert db.normalize_url("postgresql+psycopg://u:p@h/d") == "postgresql+psycopg://u:p@h/d"
    assert db.normalize_url("sqlite:///runs/a.db") == "sqlite:///runs/a.db"
    with pytest.raises(ValueError, match="not supported; allowed: sqlite, postgresql"):
        db.normalize_url("mysql://u:p@h/d")
    with pytest.raises(ValueError, match="is not a database URL"):
        db.normalize_url("runs/advisor.db")


def test_url_for_display_hides_password(url: str) -> None:
    with connect(url) as d:
        if d.backend == "postgresql":
            password = db.normalize_url(url).split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
            assert "***" in d.url_for_display and f":{password}@" not in d.url_for_display
            assert d.url == db.normalize_url(url)
        else:
            assert d.url_for_display == d.url


def test_connect_migrates_once_and_again_is_a_no_op(url: str) -> None:
    from sqlalchemy import inspect, text

    connect(url).close()
    with connect(url) as d:
        names = set(inspect(d._engine).get_table_names())
        assert {"advisor_studies", "advisor_trials", "advisor_measurements", "advisor_exports",
                "advisor_alembic_version"} <= names
        assert "alembic_version" not in names  # Optuna's version table stays Optuna's
        with d._read() as s:
            assert s.execute(text("SELECT version_num FROM advisor_alembic_version")).scalars().all() == ["0007"]


def test_migrations_downgrade_and_upgrade_again(url: str) -> None:
    from alembic import command
    from sqlalchemy import inspect

    from db.connection import alembic_config

    with connect(url) as d:
        d.upsert_study("s", {})
        cfg = alembic_config()
        with d._engine.execution_options(advisor_write=True).connect() as conn, conn.begin():
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        assert not any(n.startswith("advisor_") and n != "advisor_alembic_version"
                       for n in inspect(d._engine).get_table_names())
    with connect(url) as d:
        assert db.list_studies(d) == []


def test_upgrade_to_0002_keeps_earlier_trials_and_records_who_proposed(url: str) -> None:
    """A database written before revision 0002 (no ``proposer``) upgrades in place: its trials stay, their
    proposer reads None; trials recorded afterwards carry theirs."""
    from alembic import command

    from db.connection import alembic_config

    with connect(url) as d:
        d.upsert_study("s", {})
        d.start_trial("s", 0, params={"a": 1}, worker="w", proposer="model")
        cfg = alembic_config()
        with d._engine.execution_options(advisor_write=True).connect() as conn, conn.begin():
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0001")  # as an older deploy-advisor left it
    with connect(url) as d:  # connect() upgrades to head again
        old = db.queries.get_trial(d, "s", 0)
        assert old is not None and old.params == {"a": 1} and old.worker == "w" and old.proposer is None
        d.record_invalid("s", 1, params={}, reason="rule: x", proposer="sampler")
        d.start_trial("s", 2, params={}, proposer="grid")
        assert [t.proposer for t in db.queries.list_trials(d, "s")] == [None, "sampler", "grid"]


def test_upgrade_to_0006_reads_the_old_reasons_once_into_columns(url: str) -> None:
    """Rows written before 0006 said "reused" only in their reason and "baseline" only as the proposer; the
    upgrade fills ``reused_from``, ``baseline`` and ``executed`` from them, and the budget counts from the columns."""
    from alembic import command

    from db.connection import alembic_config

    with connect(url) as d:
        d.upsert_study("s", {})
        old = [  # (number, state, proposer, failure_kind, reason) as tuners before 0006 recorded them
            (0, TrialState.COMPLETE, "baseline", None, None),
            (1, TrialState.COMPLETE, "sampler", None, None),
            (2, TrialState.FAILED, "sampler", "oom", "CUDA out of memory"),
            (3, TrialState.FAILED, "sampler", "environment", "node lost (retried on a fresh placement: …)"),
            (4, TrialState.COMPLETE, "sampler", None, "same configuration as trial 1; its measurements stand"),
            (5, TrialState.INTERRUPTED, "model", "interrupted", "interrupted (Ctrl-C or SIGTERM)"),
            (6, TrialState.COMPLETE, "model", None, "retried on a fresh placement: same configuration as before"),
        ]
        for number, state, proposer, kind, reason in old:
            tid = d.start_trial("s", number, params={}, proposer=proposer)
            d.finish_trial(tid, state, failure_kind=kind, reason=reason)
        d.start_trial("s", 7, params={}, proposer="repeat", repeat_of=1)
        cfg = alembic_config()
        with d._engine.execution_options(advisor_write=True).connect() as conn, conn.begin():
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0005")
    with connect(url) as d:  # upgrades to head again
        got = {t.number: (t.executed, t.reused_from, t.baseline) for t in db.queries.list_trials(d, "s")}
        assert got == {0: (True, None, True), 1: (True, None, False), 2: (True, None, False), 3: (False, None, False),
                       4: (False, 1, False), 5: (False, None, False), 6: (True, None, False), 7: (False, None, False)}
        assert d.budget_used("s") == 3  # trials 1, 2 and 6: not the baseline, the environment, the reuse
        assert d.budget_used("s", in_flight=True) == 3  # the running trial is a repeat: outside the search
        assert db.queries.get_study(d, "s").budget_used == 3


def test_models_and_migrations_agree(url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from db.models import TABLE_PREFIX, VERSION_TABLE, Base

    with connect(url) as d, d._engine.connect() as conn:
        mc = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "version_table": VERSION_TABLE,
                "include_object": lambda o, name, type_, r, c: type_ != "table" or name.startswith(TABLE_PREFIX),
            },
        )
        assert compare_metadata(mc, Base.metadata) == []


def test_every_measurement_field_has_a_column() -> None:
    from db.models import MEASUREMENT_COLUMNS

    assert set(MEASUREMENT_COLUMNS) == set(Measurement.model_fields) - {"raw"}


def test_unavailable_databases_say_why_in_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    for url, words in [
        ("postgresql+psycopg://u:secret@127.0.0.1:1/none", ["127.0.0.1"]),
        ("mysql://u:secret@h/d", ["not supported"]),
        ("runs/advisor.db", ["not a database URL"]),
        (f"sqlite:///{blocked}/sub/advisor.db", ["cannot create"]),
    ]:
        with pytest.raises(db.DatabaseUnavailable) as info:
            connect(url)
        message = str(info.value)
        assert "\n" not in message and "secret" not in message, message
        assert all(w in message for w in words), message


def test_schema_newer_than_the_code(url: str) -> None:
    from sqlalchemy import text

    with connect(url) as d, d._write() as s:
        s.execute(text("UPDATE advisor_alembic_version SET version_num = '9999'"))
    with pytest.raises(db.DatabaseUnavailable, match="revision this deploy-advisor does not know.*9999"):
        connect(url)


def test_in_memory_sqlite() -> None:
    with connect("sqlite://") as d:
        d.upsert_study("m", {})
        tid = d.start_trial("m", 0, params={})
        d.finish_trial(tid, TrialState.COMPLETE, measurements=[full_measurement()])
        trial = db.get_trial(d, "m", 0)
        assert trial is not None and trial.measurements == (full_measurement(),)


_RACE = """
import sys, time
import db
url, at, i = sys.argv[1], float(sys.argv[2]), sys.argv[3]
time.sleep(max(0.0, at - time.time()))
d = db.connect(url)
d.upsert_study("shared", {"worker": i})
d.upsert_study("own-" + i, {})
d.close()
"""


def test_processes_connecting_at_once(url: str) -> None:
    """Several tuner workers start together on an empty database: one migrates, the others wait, none fails."""
    n = 4
    at = time.time() + 3.0  # after every interpreter has imported
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACE, url, str(at), str(i)], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(n)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with connect(url) as d:
        names = [s.name for s in db.list_studies(d)]
        assert names == sorted(["shared", *(f"own-{i}" for i in range(n))])


_FIRST_START = """
import sys, time
import optuna
import db
folder, at, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
optuna.logging.set_verbosity(optuna.logging.ERROR)
for k in range(rounds):  # every round a new file, both processes released at the same instant
    time.sleep(max(0.0, at + k * 0.5 - time.time()))
    url = f"sqlite:///{folder}/r{k}/advisor.db"
    optuna.create_study(storage=db.optuna_storage(url), study_name="s", direction="maximize", load_if_exists=True)
    db.connect(url).close()
"""


def test_two_tuners_start_at_once_on_a_new_sqlite_file(tmp_path: Path) -> None:
    """What `advisor tune` does first — Optuna's storage and study, then our tables — by two processes at the same
    instant on a new SQLite file, several rounds: both succeed every time (Optuna's plain ``CREATE TABLE`` raced
    without ``db.connection.first_start_lock``: "table studies already exists", a duplicate ``alembic_version``)."""
    rounds, at = 6, time.time() + 6.0  # after both interpreters have imported
    for k in range(rounds):
        (tmp_path / f"r{k}").mkdir()
    ps = [subprocess.Popen([sys.executable, "-c", _FIRST_START, str(tmp_path), str(at), str(rounds)], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in ps:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
    import optuna

    for k in range(rounds):
        url = f"sqlite:///{tmp_path}/r{k}/advisor.db"
        assert len(optuna.get_all_study_summaries(db.optuna_storage(url))) == 1


def test_shares_the_database_with_optuna(url: str) -> None:
    import optuna

    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(db.normalize_url(url))
    study = optuna.create_study(study_name="o", storage=storage, direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with connect(url) as d:
        d.upsert_study("s", {}, optuna_study_name="o")
        assert db.get_study(d, "s").optuna_study_name == "o"  # type: ignore[union-attr]
    # and Optuna still opens its study afterwards
    again = optuna.load_study(study_name="o", storage=optuna.storages.RDBStorage(db.normalize_url(url)))
    assert len(again.trials) == 2


# ---------------------------------------------------------------------------------------------- round trips


def test_trial_round_trip(database: Database) -> None:
    cfg = disaggregated()
    topology = {"instances": [{"role": "decode", "node": "n1", "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "port": 8100}]}
    params = {"decode.dp": 8, "eplb.enabled": True, "prefill.mnbt": 16384, "router": "power_of_two"}
    resources = {"process_groups": [4242, 4243], "placement_groups": ["pg-1"], "ports": [8100, 8200]}
    timings = {"deploy_s": 41.25, "warmup_s": 3.5, "measure_s": 301.0 + 1 / 3, "teardown_s": 2.0}
    levels = [full_measurement(128), sparse_measurement(8), full_measurement(32)]
    log = "line 1\nline 2 with ünïcode\n"

    tid = database.start_trial(STUDY, 7, params=params, config=cfg, topology=topology, worker="w1")
    database.record_resources(tid, resources)
    database.finish_trial(
        tid, TrialState.COMPLETE, measurements=levels, timings=timings,
        objectives={"throughput_per_gpu": 812.5, "p90_tokens_per_s_per_user": 41.0}, violation=-0.25,
        reason="ok", log_tail=log,
    )
    export_id = database.record_export(tid, "vllm", "/tmp/out/launch.sh", "AB" * 32)

    t = db.get_trial(database, STUDY, 7)
    assert t is not None
    assert (t.id, t.study, t.number, t.state, t.worker) == (tid, STUDY, 7, TrialState.COMPLETE, "w1")
    assert t.config == cfg and isinstance(t.config, DeploymentConfig)
    assert t.config_json == cfg.model_dump(mode="json")
    assert t.config_text == cfg.describe() and t.gpus == cfg.total_gpus
    assert t.params == params and t.topology == topology and t.resources == resources
    assert t.timings == timings and t.deploy_s == 41.25
    assert t.objectives == {"throughput_per_gpu": 812.5, "p90_tokens_per_s_per_user": 41.0}
    assert list(t.objectives) == ["throughput_per_gpu", "p90_tokens_per_s_per_user"]  # order kept
    assert t.violation == -0.25 and t.reason == "ok" and t.log_tail == log
    assert t.measurements == tuple(sorted(levels, key=lambda m: m.concurrency))  # by concurrency, all equal
    sparse = t.measurements[0]
    assert sparse.p90_ttft_ms is None and sparse.throughput_per_gpu is None and sparse.raw == {}
    assert [(e.id, e.format, e.path, e.sha256) for e in t.exports] == [(export_id, "vllm", "/tmp/out/launch.sh", "ab" * 32)]
    for stamp in (t.started_at, t.finished_at, t.heartbeat_at, t.exports[0].created_at):
        assert stamp is not None and stamp.tzinfo is not None and stamp.utcoffset() == timedelta(0)
    assert t.started_at <= t.finished_at  # type: ignore[operator]
    assert abs(datetime.now(UTC) - t.started_at) < timedelta(minutes=5)


def test_aggregated_and_configless_trials(database: Database) -> None:
    a = database.start_trial(STUDY, 0, params={"tp": 4}, config=aggregated())
    b = database.start_trial(STUDY, 1, params={})
    t0, t1 = db.get_trial(database, STUDY, 0), db.get_trial(database, STUDY, 1)
    assert t0 is not None and t0.id == a and t0.config == aggregated() and t0.gpus == 4
    assert t1 is not None and t1.id == b and t1.config is None and t1.config_text is None and t1.gpus is None
    assert t1.timings == {} and t1.objectives is None and t1.measurements == ()


def test_not_a_number_is_stored_as_none(database: Database) -> None:
    m = full_measurement(16).model_copy(update={"p99_itl_ms": math.nan, "raw": {"x": math.nan, "y": [math.inf, 1.0]}})
    tid = database.start_trial(STUDY, 0, params={"v": math.nan})
    database.finish_trial(tid, TrialState.COMPLETE, measurements=[m], timings={"deploy_s": math.nan},
                          objectives={"a": math.nan, "b": 2.0}, violation=math.nan)
    t = db.get_trial(database, STUDY, 0)
    assert t is not None
    got = t.measurements[0]
    assert got.p99_itl_ms is None and got.raw == {"x": None, "y": [None, 1.0]}
    assert got.model_dump(exclude={"p99_itl_ms", "raw"}) == m.model_dump(exclude={"p99_itl_ms", "raw"})
    assert t.params == {"v": None} and t.objectives == {"a": None, "b": 2.0}
    assert t.violation is None and t.deploy_s is None


def test_text_is_made_storable(database: Database) -> None:
    tid = database.start_trial(STUDY, 0, params={})
    long_log = "x" * (db.LOG_TAIL_MAX_CHARS + 10) + "END"
    database.finish_trial(tid, TrialState.FAILED, reason="bad\x00byte", log_tail=long_log, failure_kind="deploy",
                          violation=math.inf)
    t = db.get_trial(database, STUDY, 0)
    assert t is not None and t.reason == "bad\ufffdbyte" and t.violation == math.inf and not t.feasible
    assert t.log_tail is not None and len(t.log_tail) == db.LOG_TAIL_MAX_CHARS and t.log_tail.endswith("END")


def test_long_labels_are_clipped_alike_on_every_backend(database: Database) -> None:
    database.upsert_study("long", {}, executor="e" * 99, engine_version="v" * 99, hardware="h" * 999)
    tid = database.start_trial("long", 0, params={}, worker="w" * 999)
    database.finish_trial(tid, TrialState.FAILED, failure_kind="k" * 99,
                          measurements=[sparse_measurement().model_copy(update={"source": "s" * 99})])
    database.record_export(tid, "f" * 99, "/p" * 500, "0" * 64)
    st, t = db.get_study(database, "long"), db.get_trial(database, "long", 0)
    assert st is not None and (len(st.executor), len(st.engine_version), len(st.hardware)) == (32, 64, 200)  # type: ignore[arg-type]
    assert t is not None and (len(t.worker), len(t.failure_kind)) == (200, 64)  # type: ignore[arg-type]
    assert len(t.measurements[0].source) == 32 and len(t.exports[0].format) == 32 and len(t.exports[0].path) == 1000
    with pytest.raises(ValueError, match="at most 200 characters"):
        database.upsert_study("n" * 201, {})


def test_upsert_study(database: Database) -> None:
    first = db.get_study(database, STUDY)
    assert first is not None and first.executor == "simulated" and first.description is None
    sid = database.upsert_study(STUDY, {"model": "kimi"}, description="second run", engine_version="0.32.0",
                                hardware="8xH200", optuna_study_name="opt")
    assert database.upsert_study(STUDY, {"model": "kimi"}) == sid  # keywords left None keep their values
    st = db.get_study(database, STUDY)
    assert st is not None
    assert (st.job, st.description, st.executor, st.engine_version, st.hardware, st.optuna_study_name) == (
        {"model": "kimi"}, "second run", "simulated", "0.32.0", "8xH200", "opt")
    assert st.created_at == first.created_at and st.updated_at >= first.updated_at
    assert db.get_study(database, "nope") is None
    with pytest.raises(ValueError, match="non-empty name"):
        database.upsert_study(" ", {})


# ---------------------------------------------------------------------------------------------- states


def test_start_trial_is_idempotent_while_running(database: Database) -> None:
    tid = database.start_trial(STUDY, 3, params={"a": 1}, worker="w1")
    assert database.start_trial(STUDY, 3, params={"a": 1}, worker="w1") == tid
    assert [t.number for t in db.list_trials(database, STUDY)] == [3]
    database.finish_trial(tid, TrialState.FAILED, reason="boom")
    with pytest.raises(IllegalTransition, match="a failed trial cannot become running"):
        database.start_trial(STUDY, 3, params={"a": 1})


def test_finish_is_guarded(database: Database) -> None:
    tid = database.start_trial(STUDY, 0, params={})
    with pytest.raises(IllegalTransition):
        database.finish_trial(tid, TrialState.RUNNING)
    database.finish_trial(tid, TrialState.COMPLETE, measurements=[full_measurement(8)], objectives={"o": 1.0})
    for again in (TrialState.COMPLETE, TrialState.FAILED, TrialState.INTERRUPTED):
        with pytest.raises(IllegalTransition, match="a complete trial cannot become"):
            database.finish_trial(tid, again, measurements=[full_measurement(8)], objectives={"o": 9.0})
    t = db.get_trial(database, STUDY, 0)
    assert t is not None and t.state is TrialState.COMPLETE and t.objectives == {"o": 1.0}
    assert len(t.measurements) == 1  # never duplicated
    assert _sql_count(database, "advisor_measurements") == 1


def test_record_invalid(database: Database) -> None:
    cfg = aggregated(tp=3)
    a = database.record_invalid(STUDY, 0, params={"tp": 3}, config=cfg, reason="TP 3 does not divide 8 GPUs",
                                failure_kind="gpu_count")
    assert database.record_invalid(STUDY, 0, params={"tp": 3}, config=cfg, reason="again") == a  # idempotent
    t = db.get_trial(database, STUDY, 0)
    assert t is not None and t.state is TrialState.INVALID and t.reason == "TP 3 does not divide 8 GPUs"
    assert t.failure_kind == "gpu_count" and t.config == cfg and t.finished_at is not None
    with pytest.raises(IllegalTransition):
        database.finish_trial(a, TrialState.COMPLETE)
    with pytest.raises(IllegalTransition):
        database.start_trial(STUDY, 0, params={})

    running = database.start_trial(STUDY, 1, params={})  # a running trial found invalid becomes invalid
    assert database.record_invalid(STUDY, 1, params={"x": 1}, reason="late rule") == running
    t1 = db.get_trial(database, STUDY, 1)
    assert t1 is not None and t1.state is TrialState.INVALID and t1.params == {"x": 1}

    done = database.start_trial(STUDY, 2, params={})
    database.finish_trial(done, TrialState.COMPLETE)
    with pytest.raises(IllegalTransition, match="a complete trial cannot become invalid"):
        database.record_invalid(STUDY, 2, params={}, reason="no")


def test_unknown_study_and_trial(database: Database) -> None:
    with pytest.raises(UnknownStudy, match=f"no study named 'nope'; known: {STUDY}"):
        database.start_trial("nope", 0, params={})
    with pytest.raises(UnknownStudy):
        db.list_trials(database, "nope")
    assert db.get_trial(database, STUDY, 99) is None
    for call in (
        lambda: database.finish_trial(999, TrialState.COMPLETE),
        lambda: database.heartbeat(999),
        lambda: database.record_resources(999, {}),
        lambda: database.record_export(999, "json", "x.json", "0" * 64),
        lambda: database.mark_interrupted(999, "gone"),
    ):
        with pytest.raises(UnknownTrial, match="no trial with id 999"):
            call()
    tid = database.start_trial(STUDY, 0, params={})
    with pytest.raises(ValueError, match="sha256 must be 64 hex digits"):
        database.record_export(tid, "json", "x.json", "abc")


def test_heartbeat_stale_and_interrupted(database: Database) -> None:
    from sqlalchemy import update

    from db.models import TrialRow

    a = database.start_trial(STUDY, 0, params={}, worker="dead")
    b = database.start_trial(STUDY, 1, params={}, worker="alive")
    database.record_resources(a, {"process_groups": [111]})
    assert database.heartbeat(a) and database.heartbeat(b)
    assert database.stale_trials(STUDY, 3600) == []
    assert [t.id for t in database.running_trials(STUDY)] == [a, b]
    with database._write() as s:  # the dead worker's last heartbeat was two hours ago
        s.execute(update(TrialRow).where(TrialRow.id == a).values(heartbeat_at=datetime.now(UTC) - timedelta(hours=2)))
    stale = database.stale_trials(STUDY, 3600)
    assert [(t.id, t.worker, t.resources) for t in stale] == [(a, "dead", {"process_groups": [111]})]
    database.mark_interrupted(a, "worker 'dead' stopped sending heartbeats")
    assert database.stale_trials(STUDY, 3600) == []
    assert [t.id for t in database.running_trials(STUDY)] == [b]
    assert database.heartbeat(a) is False  # a late heartbeat does not revive it
    t = db.get_trial(database, STUDY, 0)
    assert t is not None and t.state is TrialState.INTERRUPTED and t.failure_kind == "interrupted"
    with pytest.raises(IllegalTransition):
        database.mark_interrupted(a, "twice")
    with pytest.raises(UnknownStudy):
        database.stale_trials("nope", 1)


# ---------------------------------------------------------------------------------------------- all or nothing


def _assert_untouched(database: Database, number: int) -> None:
    t = db.get_trial(database, STUDY, number)
    assert t is not None
    assert t.state is TrialState.RUNNING and t.finished_at is None and t.objectives is None
    assert t.measurements == () and t.reason is None and t.timings == {}
    assert _sql_count(database, "advisor_measurements") == 0


def test_exception_mid_finish_rolls_everything_back(database: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    import db.engine as engine

    tid = database.start_trial(STUDY, 0, params={})
    real = engine.measurement_row
    calls = {"n": 0}

    def second_one_breaks(trial_id: int, m: Measurement):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("disk on fire")
        return real(trial_id, m)

    monkeypatch.setattr(engine, "measurement_row", second_one_breaks)
    with pytest.raises(RuntimeError, match="disk on fire"):
        database.finish_trial(tid, TrialState.COMPLETE, measurements=[full_measurement(8), full_measurement(16)],
                              timings={"deploy_s": 1.0}, objectives={"o": 1.0}, reason="r")
    assert calls["n"] == 2  # it failed after the trial row and the first level were written
    _assert_untouched(database, 0)

    monkeypatch.setattr(engine, "measurement_row", real)
    database.finish_trial(tid, TrialState.COMPLETE, measurements=[full_measurement(8), full_measurement(16)])
    assert _sql_count(database, "advisor_measurements") == 2


def test_bad_input_writes_nothing(database: Database) -> None:
    tid = database.start_trial(STUDY, 0, params={})
    with pytest.raises(ValueError, match="two measurements for c=8"):
        database.finish_trial(tid, TrialState.COMPLETE, measurements=[full_measurement(8), sparse_measurement(8)])
    with pytest.raises(ValueError, match="unknown timing bench_s; allowed: deploy_s, warmup_s, measure_s, teardown_s"):
        database.finish_trial(tid, TrialState.COMPLETE, timings={"bench_s": 1.0})
    with pytest.raises(TypeError, match="search_spaces.Measurement"):
        database.finish_trial(tid, TrialState.COMPLETE, measurements=[{"concurrency": 1}])  # type: ignore[list-item]
    _assert_untouched(database, 0)


def test_measurements_are_unique_per_level(database: Database) -> None:
    """One level is one row: a concurrency twice is refused; rate levels sharing a concurrency cap are distinct."""
    tid = database.start_trial(STUDY, 0, params={})
    r1 = full_measurement(64).model_copy(update={"request_rate": 2.0})
    r2 = full_measurement(64).model_copy(update={"request_rate": 4.0})
    with pytest.raises(ValueError, match="two measurements for 2 req/s"):
        database.finish_trial(tid, TrialState.COMPLETE, measurements=[r1, r2, r1])
    database.finish_trial(tid, TrialState.COMPLETE, measurements=[full_measurement(64), r1, r2])
    assert _sql_count(database, "advisor_measurements") == 3
    got = queries.get_trial(database, STUDY, 0)
    assert got is not None and sorted(m.label() for m in got.measurements) == ["2 req/s", "4 req/s", "c=64"]


def test_racing_finishes(database: Database) -> None:
    """Workers finishing one trial at once: exactly one wins, the rest get IllegalTransition."""
    tid = database.start_trial(STUDY, 0, params={})
    levels = [full_measurement(8), full_measurement(16), full_measurement(32)]
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def finish(i: int) -> None:
        barrier.wait()
        try:
            database.finish_trial(tid, TrialState.COMPLETE, measurements=levels, objectives={"worker": float(i)})
            outcomes.append("won")
        except IllegalTransition:
            outcomes.append("refused")

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["refused"] * 5 + ["won"]
    assert _sql_count(database, "advisor_measurements") == 3


# ---------------------------------------------------------------------------------------------- queries


def lvl(c: int, tput: float | None, speed: float | None, ttft: float | None, completed: int = 10) -> Measurement:
    return Measurement(concurrency=c, source="simulated", gpus=8, num_requests=10, completed=completed,
                       failed=10 - completed, throughput_per_gpu=tput, p90_tokens_per_s_per_user=speed,
                       p90_ttft_ms=ttft)


def populate(d: Database, trials: list[tuple[int, TrialState, list[Measurement], dict | None, float | None]]) -> None:
    for number, state, levels, objectives, violation in trials:
        if state is TrialState.INVALID:
            d.record_invalid(STUDY, number, params={"n": number}, config=aggregated(), reason=f"rule {number}")
            continue
        tid = d.start_trial(STUDY, number, params={"n": number}, config=aggregated())
        if state is not TrialState.RUNNING:
            d.finish_trial(tid, state, measurements=levels, objectives=objectives, violation=violation,
                           reason=None if state is TrialState.COMPLETE else f"why {number}",
                           failure_kind=None if state is TrialState.COMPLETE else "benchmark",
                           log_tail=f"first\nlast words of {number}\n\n")


C, F = TrialState.COMPLETE, TrialState.FAILED

#: Hand-made: (number, state, levels, objectives, violation).
HAND_MADE = [
    (0, C, [lvl(8, 100, 50, 200), lvl(32, 300, 30, 900), lvl(128, 500, 10, 4000)], {"throughput_per_gpu": 300.0}, -0.1),
    (1, C, [lvl(8, 150, 45, 150), lvl(32, 300, 35, 1500)], {"throughput_per_gpu": 310.0}, 0.0),
    (2, F, [lvl(8, 900, 90, 10)], {"throughput_per_gpu": 900.0}, None),  # failed: never best, never on the front
    (3, C, [lvl(8, 400, 30, 1800), lvl(32, 600, 5, 2500, completed=0)], {"throughput_per_gpu": 400.0}, 0.5),
    (4, C, [lvl(8, 300, 35, 1500), lvl(32, None, 40, 100)], {"throughput_per_gpu": 305.0}, None),
    (5, TrialState.INVALID, [], None, None),
    (6, TrialState.RUNNING, [], None, None),
    (7, TrialState.INTERRUPTED, [], None, None),
]


def test_best_under_slo_hand_made(database: Database) -> None:
    populate(database, HAND_MADE)
    best = db.best_under_slo(database, STUDY, [])
    assert best is not None and (best[0].number, best[1].concurrency) == (0, 128)  # 500/GPU; (3, 32) served nobody
    assert best[1] == HAND_MADE[0][2][2] and best[0].config == aggregated()
    trial, level = best  # a Best unpacks as (trial, measurement) and reads like a Level
    assert (best.trial_number, best.concurrency, best.throughput_per_gpu, best.gpus, best.config_text) == (
        trial.number, level.concurrency, 500, 4, aggregated().describe())

    slos = [SLO(metric="p90_ttft_ms", op="<=", value=2000)]
    best = db.best_under_slo(database, STUDY, slos)
    assert best is not None and (best[0].number, best[1].concurrency) == (3, 8)  # 400 at 1800 ms

    slos.append(SLO(metric="p90_tokens_per_s_per_user", op=">=", value=31))
    best = db.best_under_slo(database, STUDY, slos)
    # 300/GPU three times: trial 0 @32 (30 tok/s: no), trial 1 @32 (35: yes), trial 4 @8 (35: yes) → lower number
    assert best is not None and (best[0].number, best[1].concurrency) == (1, 32)

    best = db.best_under_slo(database, STUDY, slos, metric="p90_ttft_ms")  # a latency: lowest wins
    assert best is not None and (best[0].number, best[1].concurrency) == (4, 32)

    assert db.best_under_slo(database, STUDY, [SLO(metric="p90_ttft_ms", op="<=", value=1)]) is None
    with pytest.raises(ValueError, match="unknown metric 'gpus'"):
        db.best_under_slo(database, STUDY, [], metric="gpus")


def test_pareto_hand_made(database: Database) -> None:
    populate(database, HAND_MADE)
    front = db.pareto_front(database, STUDY)
    # eligible: (500,10) (400,30) (300,30) (300,35)×2 (150,45) (100,50); only (300,30) is dominated
    assert [(p.trial_number, p.measurement.concurrency) for p in front] == [
        (0, 128), (3, 8), (1, 32), (4, 8), (1, 8), (0, 8)]
    assert front[0].config_text == aggregated().describe() and front[0].gpus == 4 and front[0].state is C
    assert (front[0].concurrency, front[0].throughput_per_gpu, front[0].p90_ttft_ms) == (128, 500, 4000)
    with pytest.raises(AttributeError):
        front[0].no_such_metric  # noqa: B018

    slos = [SLO(metric="p90_ttft_ms", op="<=", value=1000)]
    front = db.pareto_front(database, STUDY, slos=slos)
    assert [(p.trial_number, p.measurement.concurrency) for p in front] == [(0, 32), (1, 8), (0, 8)]

    front = db.pareto_front(database, STUDY, x="throughput_per_gpu", y="p90_ttft_ms")  # latency axis minimized
    assert [(p.trial_number, p.measurement.concurrency) for p in front] == [(0, 128), (3, 8), (0, 32), (1, 8)]


def _meets(m: Measurement, slos: list[tuple[str, str, float]]) -> bool:
    for metric, op, bound in slos:
        v = getattr(m, metric)
        if v is None or not (v <= bound if op == "<=" else v >= bound):
            return False
    return True


def _candidates(data, slos, metrics):  # type: ignore[no-untyped-def]
    return [
        (number, m) for number, state, levels, _, _ in data if state is C for m in levels
        if m.completed > 0 and all(getattr(m, k) is not None for k in metrics) and _meets(m, slos)
    ]


def _random_study(seed: int):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    data = []
    for number in range(25):
        state = rng.choice([C, C, C, C, F])
        levels = [
            lvl(c, rng.choice([100.0, 200.0, 300.0, 400.0, 500.0, None]), rng.choice([10.0, 20.0, 30.0, 40.0]),
                rng.choice([100.0, 500.0, 1000.0, 3000.0, None]), completed=rng.choice([0, 10, 10, 10]))
            for c in rng.sample([1, 4, 8, 16, 32, 64], k=rng.randint(1, 4))
        ]
        data.append((number, state, levels, {"throughput_per_gpu": rng.uniform(0, 1000)}, rng.choice([None, -1.0, 1.0])))
    return data


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_best_and_pareto_match_brute_force(database: Database, seed: int) -> None:
    data = _random_study(seed)
    populate(database, data)
    for slos in ([], [("p90_ttft_ms", "<=", 1000.0)], [("p90_ttft_ms", "<=", 1000.0), ("p90_tokens_per_s_per_user", ">=", 20.0)]):
        objs = [SLO(metric=m, op=op, value=v) for m, op, v in slos]

        cands = _candidates(data, slos, ["throughput_per_gpu"])
        got = db.best_under_slo(database, STUDY, objs)
        if not cands:
            assert got is None
        else:
            top = max(m.throughput_per_gpu for _, m in cands)
            expect = min((n, m.concurrency) for n, m in cands if m.throughput_per_gpu == top)
            assert got is not None and (got[0].number, got[1].concurrency) == expect

        for x, y, sx, sy in [("throughput_per_gpu", "p90_tokens_per_s_per_user", 1, 1),
                             ("throughput_per_gpu", "p90_ttft_ms", 1, -1)]:
            pts = [(n, m.concurrency, sx * getattr(m, x), sy * getattr(m, y)) for n, m in _candidates(data, slos, [x, y])]
            expect_front = {
                (n, c) for n, c, px, py in pts
                if not any(qx >= px and qy >= py and (qx > px or qy > py) for _, _, qx, qy in pts)
            }
            front = db.pareto_front(database, STUDY, x=x, y=y, slos=objs or None)
            assert {(p.trial_number, p.measurement.concurrency) for p in front} == expect_front
            xs = [sx * p.metric(x) for p in front]
            assert xs == sorted(xs, reverse=True)


def test_history_hand_made(database: Database) -> None:
    populate(database, [
        (0, C, [], {"throughput_per_gpu": 100.0, "p90_tokens_per_s_per_user": 9.0}, None),
        (1, F, [], {"throughput_per_gpu": 900.0}, None),  # failed: not a best
        (2, C, [], {"throughput_per_gpu": 800.0}, 0.3),  # infeasible: not a best
        (3, TrialState.INVALID, [], None, None),
        (4, C, [], {"throughput_per_gpu": 300.0}, -0.5),
        (5, C, [], {"throughput_per_gpu": 200.0}, 0.0),
    ])
    h = db.history(database, STUDY)
    assert [(p.number, p.value, p.feasible, p.best) for p in h] == [
        (0, 100.0, True, 100.0), (1, 900.0, True, 100.0), (2, 800.0, False, 100.0), (3, None, True, 100.0),
        (4, 300.0, True, 300.0), (5, 200.0, True, 300.0)]
    assert h[1].state is F
    lat = db.history(database, STUDY, "p90_tokens_per_s_per_user")
    assert [p.best for p in lat] == [9.0] * 6
    low = db.history(database, STUDY, "throughput_per_gpu", maximize=False)
    assert [p.best for p in low] == [100.0, 100.0, 100.0, 100.0, 100.0, 100.0]


def test_studies_trials_failures(database: Database) -> None:
    populate(database, HAND_MADE)
    database.upsert_study("empty", {}, description="nothing yet")
    studies = db.list_studies(database)
    assert [s.name for s in studies] == [STUDY, "empty"]
    st = studies[0]
    assert (st.trials, st.done, st.failed, st.invalid, st.running, st.interrupted) == (8, 4, 1, 1, 1, 1)
    # best feasible complete: trial 0 (300, -0.1), 1 (310, 0.0), 4 (305, None); trial 3 (400) violates
    assert (st.best_objective, st.best, st.best_trial) == ("throughput_per_gpu", 310.0, 1)
    assert st.job["model"] == "deepseek-r1"
    empty = studies[1]
    assert empty.trials == 0 and empty.best is None and empty.description == "nothing yet"

    assert [t.number for t in db.list_trials(database, STUDY)] == list(range(8))
    assert [t.number for t in db.list_trials(database, STUDY, states=["failed", TrialState.INVALID])] == [2, 5]
    with pytest.raises(ValueError, match="unknown trial state 'done'"):
        db.list_trials(database, STUDY, states=["done"])

    fails = db.failures(database, STUDY)
    assert [(f.number, f.state, f.reason) for f in fails] == [
        (2, F, "why 2"), (5, TrialState.INVALID, "rule 5"), (7, TrialState.INTERRUPTED, "why 7")]

    levels = db.measurements(database, STUDY)
    assert [(lv.trial_number, lv.measurement.concurrency) for lv in levels] == [
        (0, 8), (0, 32), (0, 128), (1, 8), (1, 32), (2, 8), (3, 8), (3, 32), (4, 8), (4, 32)]
    assert all(lv.config_text == aggregated().describe() and lv.gpus == 4 for lv in levels)
    assert levels[2].measurement == HAND_MADE[0][2][2]


# ---------------------------------------------------------------------------------------------- named queries


def test_named_queries(database: Database) -> None:
    populate(database, HAND_MADE)
    assert {"studies", "trials", "measurements", "best", "pareto", "history", "failures"} <= set(NAMED_QUERIES)
    for q in NAMED_QUERIES.values():
        assert q.help and "\n" not in q.help and all(a.help for a in q.args)
    examples = {
        "studies": [], "trials": [STUDY], "trial": [STUDY, "0"], "measurements": [STUDY],
        "best": [STUDY, "p90_ttft_ms<=2000"], "pareto": [STUDY], "history": [STUDY], "failures": [STUDY],
        "external": [],  # nothing imported here: tests/test_imports.py fills it
    }
    for name, q in NAMED_QUERIES.items():
        cols, rows = db.run_query(database, name, examples[name])
        assert cols and len(set(cols)) == len(cols), name
        assert (rows or name == "external") and all(len(r) == len(cols) for r in rows), name
        assert all(isinstance(v, (str, int, float, bool, type(None))) for r in rows for v in r), name

    cols, rows = db.run_query(database, "best", [STUDY, "slo=p90_ttft_ms<=2000, p90_tokens_per_s_per_user>=31"])
    assert rows[0][cols.index("trial")] == 1 and rows[0][cols.index("concurrency")] == 32
    cols, rows = db.run_query(database, "best", {"study": STUDY, "metric": "p90_ttft_ms"})
    assert (rows[0][cols.index("trial")], rows[0][cols.index("concurrency")]) == (4, 32)  # failed trial 2 excluded
    assert NAMED_QUERIES["best"].run(database, study=STUDY) == db.run_query(database, "best", [STUDY])  # defaults
    with pytest.raises(QueryError, match="query best needs study"):
        NAMED_QUERIES["best"].run(database)
    cols, rows = db.run_query(database, "pareto", [STUDY, "x=throughput_per_gpu", "y=p90_ttft_ms"])
    assert cols[-2:] == ["throughput_per_gpu", "p90_ttft_ms"] and [r[0] for r in rows] == [0, 3, 0, 1]
    cols, rows = db.run_query(database, "trials", [STUDY, "states=failed,invalid"])
    assert [r[0] for r in rows] == [2, 5] and "throughput_per_gpu" in cols
    cols, rows = db.run_query(database, "failures", [STUDY])
    assert rows[0][cols.index("last_log_line")] == "last words of 2"
    cols, rows = db.run_query(database, "history", [STUDY])
    assert [r[cols.index("best")] for r in rows][:2] == [300.0, 310.0]

    for name, args, message in [
        ("nope", [], "unknown query 'nope'; allowed: studies"),
        ("trials", [], "query trials needs study"),
        ("trials", ["nope"], "query trials: no study named 'nope'"),
        ("trial", [STUDY, "x"], "query trial: number must be int, got 'x'"),
        ("trial", [STUDY, "99"], f"study '{STUDY}' has no trial 99"),
        ("best", [STUDY, "p90_ttft_ms<2000"], "is not METRIC<=VALUE or METRIC>=VALUE"),
        ("best", [STUDY, "ttft<=2000"], "unknown SLO metric 'ttft'"),
        ("best", [STUDY, "", "speed"], "unknown metric 'speed'"),
        ("failures", [STUDY, "extra"], "unexpected argument 'extra'"),
        ("failures", {"study": STUDY, "x": 1}, "unknown argument x"),
        ("trials", [STUDY, "states=done"], "unknown trial state 'done'"),
    ]:
        with pytest.raises(QueryError, match=message.replace("(", r"\(").replace("[", r"\[")):
            db.run_query(database, name, args)


def test_parse_slos() -> None:
    assert queries.parse_slos("") == []
    assert queries.parse_slos(" p90_ttft_ms <= 2e3 ,p90_tokens_per_s_per_user>=20") == [
        SLO(metric="p90_ttft_ms", op="<=", value=2000.0), SLO(metric="p90_tokens_per_s_per_user", op=">=", value=20)]


def test_no_sqlalchemy_objects_leak(database: Database) -> None:
    populate(database, HAND_MADE[:2])
    import dataclasses

    for value in [*db.list_studies(database), *db.list_trials(database, STUDY), *db.measurements(database, STUDY),
                  *db.history(database, STUDY), db.get_trial(database, STUDY, 0)]:
        assert dataclasses.is_dataclass(value)
        assert not type(value).__module__.startswith("sqlalchemy") and not hasattr(value, "_sa_instance_state")


def test_pg_fixture_skips_or_fails_without_url(tmp_path: Path) -> None:
    """Without DEPLOY_ADVISOR_PG_URL a postgres test skips — but fails under CI=true."""
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "test_x.py").write_text("def test_pg(pg_url):\n    assert pg_url\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DEPLOY_ADVISOR_PG_URL", "CI")}
    env["PYTHONPATH"] = str(REPO)  # the copied conftest imports the shared fixtures of tests/
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)]
    local = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert local.returncode == 0 and "1 skipped" in local.stdout and "DEPLOY_ADVISOR_PG_URL is not set" in local.stdout
    ci = subprocess.run(cmd, cwd=tmp_path, env={**env, "CI": "true"}, capture_output=True, text=True)
    assert ci.returncode != 0 and "CI=true: PostgreSQL tests must run" in ci.stdout


def test_a_read_only_open_never_writes_and_reads_an_older_file_from_a_migrated_copy(tmp_path):
    """The read-only dashboard opened the committed H200 study (schema 0005) and migrated it: 237,568 → 249,856
    bytes. A read-only open writes nothing, not even a migration or the first-start lock file."""
    import hashlib
    import sqlite3

    from alembic import command

    from db.connection import alembic_config, make_engine

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    with db.connect(url) as database:
        database.upsert_study("s", {"name": "s"})
    engine = make_engine(url, echo=False)
    with engine.begin() as conn:  # back to the schema before the ledger's columns
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0005")
    engine.dispose()
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    def files() -> dict[str, str]:  # SQLite's shared-memory index, and an empty WAL, are not the database
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()
                if p.suffix != ".db-shm" and not (p.suffix == ".db-wal" and not p.stat().st_size)}

    (tmp_path / "old.db.lock").unlink()
    before = files()
    ro = db.connect(url, read_only=True)
    assert ro.snapshot and "0005" in ro.snapshot
    assert [s.name for s in db.queries.list_studies(ro)] == ["s"]  # read through the migrated copy
    ro.close()
    assert files() == before  # byte-identical, and no first-start lock file either
    with db.connect(url) as database:  # a writer migrates it
        assert database.snapshot is None
    current = db.connect(url, read_only=True)
    assert current.snapshot is None and [s.name for s in db.queries.list_studies(current)] == ["s"]
    current.close()
