import psycopg

from slotlake.localpg import LocalPostgres


def test_cluster_is_logical_and_matches_version(pg_cluster: LocalPostgres, pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        wal_level, version_num = conn.execute(
            "SELECT current_setting('wal_level'), current_setting('server_version_num')::int"
        ).fetchone()
    assert wal_level == "logical"
    assert version_num // 10000 == pg_cluster.version
