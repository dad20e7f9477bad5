import psycopg

from slotlake.localpg import LocalPostgres


def test_cluster_is_logical_and_matches_version(pg_cluster: LocalPostgres, pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        wal_level, version_num = conn.execute(
            "SELECT current_setting('wal_level'), current_setting('server_version_num')::int"
        ).fetchone()
    assert wal_level == "logical"
    assert version_num // 10000 == pg_cluster.version


def test_a_database_is_dropped_with_its_open_sessions(pg_cluster: LocalPostgres) -> None:
    dsn = pg_cluster.create_database("dropped_while_open")
    with psycopg.connect(dsn) as lingering:
        pg_cluster.drop_database("dropped_while_open")
        assert _is_gone(lingering)
    with psycopg.connect(pg_cluster.dsn()) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = 'dropped_while_open'"
        ).fetchone()
    assert left == (0,)
    pg_cluster.drop_database("dropped_while_open")  # gone already: not an error


def _is_gone(conn: psycopg.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False
