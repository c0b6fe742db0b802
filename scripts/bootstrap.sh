#!/usr/bin/env bash
# Installs everything the tests and the demo need on a fresh machine, and reuses
# what is already there on the next run:
#   - Debian packages: PostgreSQL server binaries, a Java runtime for Spark,
#     headless Chromium and its WebDriver (the Airflow UI in a browser, via Selenium)
#   - uv, then the virtualenv .venv with this package and its dev extra
#   - Apache Kafka's broker jars, Spark's Kafka connector and S3A jars, Hadoop's HDFS
#     mini-cluster jars and Iceberg's REST catalog server jars (Maven, cached outside the checkout)
# Idempotent; a second run takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[bootstrap] %s\n' "$*" >&2; }

need_apt=()
pg_found=""
for v in 17 16 15; do
  if [ -x "/usr/lib/postgresql/$v/bin/initdb" ]; then pg_found=$v; break; fi
done
[ -n "$pg_found" ] || need_apt+=(postgresql)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v runuser >/dev/null 2>&1 || need_apt+=(util-linux)
# Maven fetches Apache Kafka's broker jars and Spark's Kafka connector from Maven Central (below)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
# headless Chromium renders the Airflow UI in tests/e2e/test_live_stack.py
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need_apt+=(chromium)
# ... driven by Selenium through Debian's chromedriver, built from the same sources as its chromium
# (keep both current together: `apt-get install chromium chromium-driver`)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)

if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian's package starts a cluster on port 5432; the tests start their own.
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    for c in $(pg_lsclusters -h 2>/dev/null | awk '{print $1"/"$2}'); do
      $SUDO pg_ctlcluster "${c%/*}" "${c#*/}" stop >/dev/null 2>&1 || true
    done
  fi
fi

PY=${PYTHON:-python3}
if ! command -v uv >/dev/null 2>&1; then
  log "installing uv"
  "$PY" -m pip install -q --disable-pip-version-check uv
fi
UV=$(command -v uv || echo "$("$PY" -m site --user-base)/bin/uv")

stamp=.venv/.eos-installed
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$UV" venv -q -p "$PY" .venv
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing airflow-eos[dev] into .venv (first time ~1 min)"
  "$UV" pip install -q -p .venv/bin/python -e '.[dev]'
  # pyspark-client shares the pyspark directory: which package's files end up
  # on disk depends on the install order (both cases were seen on this kind of
  # machine). Make sure the full pyspark is there: its jars (spark-submit) AND
  # its Python files (4.2 client files beside 4.3 jars break Python UDFs).
  pyspark_pin=$(sed -n 's/.*"pyspark==\([0-9.]*\)".*/\1/p' pyproject.toml)
  if [ ! -d .venv/lib/python*/site-packages/pyspark/jars ] \
     || [ "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null)" != "$pyspark_pin" ]; then
    log "reinstalling pyspark $pyspark_pin over the files pyspark-client left"
    "$UV" pip install -q -p .venv/bin/python --reinstall-package pyspark "pyspark==$pyspark_pin"
  fi
  # pyspark is an sdist: every install builds it into a new ~1.4 GB revision of uv's cache and keeps the
  # old ones (62 GB after a day of fresh clones and worktrees here, and a full disk). Drop what no
  # install can reach any more.
  "$UV" cache prune -q || log "uv cache prune failed (the cache may keep growing)"
  touch "$stamp"
fi
# Byte-compile what was installed (uv does not by default), once per install: where
# PYTHONDONTWRITEBYTECODE is set (this kind of machine sets it) no Python process writes its
# .pyc files, so every one (each test worker, each CLI, Airflow and Spark worker process a test
# starts) would compile every module it imports again: importing Airflow, the provider and its
# clients took 4.4 CPU-s without them, 2.0 with. Compiling takes ~16 CPU-s.
compiled=.venv/.eos-compiled
if [ ! -f "$compiled" ] || [ "$stamp" -nt "$compiled" ]; then
  log "byte-compiling .venv (once per install)"
  .venv/bin/python -m compileall -qq -j 0 .venv/lib/python*/site-packages || log "some modules did not compile"
  touch "$compiled"
fi

# Apache Kafka's broker (tests, demo, bench): its jars from Maven Central, once, into the cache that
# airflow_eos.embedded.kafka_home() names; a later run finds the stamp and fetches nothing.
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/kafka/pom.xml)
kafka_home=${EOS_KAFKA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-eos/kafka-$kafka_version}
if [ ! -f "$kafka_home/.complete" ]; then
  log "fetching Apache Kafka $kafka_version's jars with Maven into $kafka_home"
  rm -rf "$kafka_home/lib"
  mvn -q -B -f scripts/kafka/pom.xml dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$kafka_home/lib"
  touch "$kafka_home/.complete"
fi

# Spark's Kafka connector (format("kafka")) at the pinned PySpark's version, for the classpath of
# spark-submit, the Spark Connect server and the standalone cluster's executors: its jars from Maven
# Central, once, into a cache outside the checkout, so that no Spark process downloads at run time.
spark_version=$(sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' scripts/spark-kafka/pom.xml)
spark_kafka_home=${EOS_SPARK_KAFKA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-eos/spark-kafka-$spark_version}
if [ ! -f "$spark_kafka_home/.complete" ]; then
  log "fetching Spark $spark_version's Kafka connector jars with Maven into $spark_kafka_home"
  rm -rf "$spark_kafka_home/lib"
  mvn -q -B -f scripts/spark-kafka/pom.xml dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$spark_kafka_home/lib"
  touch "$spark_kafka_home/.complete"
fi

# Hadoop's S3A file system (Spark's s3a:// writes of an Iceberg table's files on S3) at the Hadoop release of
# PySpark's client jars: hadoop-aws and the AWS SDK modules it uses, into the cache that
# airflow_eos.spark.connector.s3a_home() names; every Spark this package starts puts them on its classpath.
s3a_version=$(sed -n 's:.*<hadoop.version>\(.*\)</hadoop.version>.*:\1:p' scripts/spark-s3a/pom.xml)
s3a_home=${EOS_SPARK_S3A_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-eos/spark-s3a-$s3a_version}
if [ ! -f "$s3a_home/.complete" ]; then
  log "fetching Hadoop $s3a_version's S3A jars with Maven into $s3a_home"
  rm -rf "$s3a_home/lib"
  mvn -q -B -f scripts/spark-s3a/pom.xml dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$s3a_home/lib"
  touch "$s3a_home/.complete"
fi

# Hadoop's HDFS mini-cluster (the file target's HDFS tests): its jars from Maven Central, once, into the
# cache that airflow_eos.embedded.hdfs_home() names, at the Hadoop release of PySpark's client jars.
hadoop_version=$(sed -n 's:.*<hadoop.version>\(.*\)</hadoop.version>.*:\1:p' scripts/hdfs/pom.xml)
hdfs_home=${EOS_HDFS_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-eos/hdfs-$hadoop_version}
if [ ! -f "$hdfs_home/.complete" ]; then
  log "fetching Hadoop $hadoop_version's HDFS mini-cluster jars with Maven into $hdfs_home"
  rm -rf "$hdfs_home/lib"
  mvn -q -B -f scripts/hdfs/pom.xml dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$hdfs_home/lib"
  touch "$hdfs_home/.complete"
fi

# Apicurio Registry (the Avro source's tests): a Quarkus application, so Maven fetches it and runs
# Quarkus's build of it (scripts/schema-registry/pom.xml), once, into the cache that
# airflow_eos.embedded.schema_registry_home() names; a later run finds the stamp and builds nothing.
registry_version=$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' scripts/schema-registry/pom.xml)
registry_home=${EOS_SCHEMA_REGISTRY_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-eos/schema-registry-$registry_version}
if [ ! -f "$registry_home/.complete" ]; then
  log "building Apicurio Registry $registry_version with Maven into $registry_home (first time ~2 min)"
  rm -rf "$registry_home/build"
  mvn -q -B -f scripts/schema-registry/pom.xml package -DskipTests -Dregistry.build.dir="$registry_home/build"
  touch "$registry_home/.complete"
fi

# Apache Iceberg's REST catalog test server (the Iceberg target's tests on a REST catalog): its jars from Maven
# Central, once, into the cache that airflow_eos.embedded.iceberg_rest_home() names.
iceberg_version=$(sed -n 's:.*<iceberg.version>\(.*\)</iceberg.version>.*:\1:p' scripts/iceberg-rest/pom.xml)
iceberg_rest_home=${EOS_ICEBERG_REST_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-eos/iceberg-rest-$iceberg_version}
if [ ! -f "$iceberg_rest_home/.complete" ]; then
  log "fetching Apache Iceberg $iceberg_version's REST catalog server jars with Maven into $iceberg_rest_home"
  rm -rf "$iceberg_rest_home/lib"
  mvn -q -B -f scripts/iceberg-rest/pom.xml dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$iceberg_rest_home/lib"
  touch "$iceberg_rest_home/.complete"
fi
