"""An attempt's staging as tables in the ledger's PostgreSQL database (schema
``eos_staging``), shared by every target whose staging lives there: the
PostgreSQL target (staging shaped like its table) and the Kafka target
(staging shaped like its records). It belongs to no target, so that neither
target imports the other; both build on it, and it builds on the core only.

- :mod:`.tables`: the staging's tables (rows, and dead letters), their names,
  counting their chunks, dropping them.
- :mod:`.writer`: ``StagingWriter``, what a Spark task runs to COPY its rows
  into the staging as one chunk, and what it says of a row the database
  refused (the stage job's write task asks it, see spark/stager.py).
- :mod:`.encoding`: how the writer encodes Arrow rows for COPY.
"""
