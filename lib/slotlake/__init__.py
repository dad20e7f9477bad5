"""slotlake: a PostgreSQL pgoutput replication slot, one bounded batch at a time, into a Parquet lake."""

__version__ = "0.1.0"
