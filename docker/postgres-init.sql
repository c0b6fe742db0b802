-- The target database of the example DAGs; airflow-eos creates its ledger
-- (schema eos) and staging (schema eos_staging) in it on first use.
CREATE USER eos WITH PASSWORD 'eos';
CREATE DATABASE analytics OWNER eos;
