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

# The Maven caches below: each lives outside the checkout, under the directory the matching
# airflow_eos.embedded / airflow_eos.spark.connector function names (its EOS_*_HOME variable
# overrides it), and is filled once: a later run finds its .complete stamp and fetches nothing.

# pom_version POM PROPERTY: the version POM pins in its <PROPERTY>.
pom_version() { sed -n "s:.*<$2>\(.*\)</$2>.*:\1:p" "$1"; }

# cache_home VARIABLE NAME: the cache directory NAME, or what the environment's VARIABLE says.
cache_home() { printf '%s\n' "${!1:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-eos/$2}"; }

# fill_once HOME DIR WHAT COMMAND...: COMMAND fills HOME/DIR unless an earlier run completed it;
# a run cut short leaves no stamp, so the next one starts DIR again from empty.
fill_once() {
  local home=$1 dir=$2 what=$3
  shift 3
  [ -f "$home/.complete" ] && return 0
  log "$what into $home"
  rm -rf "${home:?}/$dir"
  "$@"
  touch "$home/.complete"
}

# fetch_jars HOME JARS POM: Maven copies POM's runtime dependencies (JARS says what they are) into HOME/lib, once.
fetch_jars() {
  fill_once "$1" lib "fetching $2 with Maven" \
    mvn -q -B -f "$3" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$1/lib"
}

# Apache Kafka's broker (tests, demo, bench): airflow_eos.embedded.kafka_home().
kafka_version=$(pom_version scripts/kafka/pom.xml kafka.version)
fetch_jars "$(cache_home EOS_KAFKA_HOME "kafka-$kafka_version")" \
  "Apache Kafka $kafka_version's jars" scripts/kafka/pom.xml

# Spark's Kafka connector (format("kafka")) at the pinned PySpark's version, for the classpath of
# spark-submit, the Spark Connect server and the standalone cluster's executors, so that no Spark
# process downloads at run time.
spark_version=$(pom_version scripts/spark-kafka/pom.xml spark.version)
fetch_jars "$(cache_home EOS_SPARK_KAFKA_HOME "spark-kafka-$spark_version")" \
  "Spark $spark_version's Kafka connector jars" scripts/spark-kafka/pom.xml

# Hadoop's S3A file system (Spark's s3a:// writes of an Iceberg table's files on S3) at the Hadoop release of
# PySpark's client jars: hadoop-aws and the AWS SDK modules it uses, into airflow_eos.spark.connector.s3a_home();
# every Spark this package starts puts them on its classpath.
s3a_version=$(pom_version scripts/spark-s3a/pom.xml hadoop.version)
fetch_jars "$(cache_home EOS_SPARK_S3A_HOME "spark-s3a-$s3a_version")" \
  "Hadoop $s3a_version's S3A jars" scripts/spark-s3a/pom.xml

# Hadoop's HDFS mini-cluster (the file target's HDFS tests), at the Hadoop release of PySpark's client jars:
# airflow_eos.embedded.hdfs_home().
hadoop_version=$(pom_version scripts/hdfs/pom.xml hadoop.version)
fetch_jars "$(cache_home EOS_HDFS_HOME "hdfs-$hadoop_version")" \
  "Hadoop $hadoop_version's HDFS mini-cluster jars" scripts/hdfs/pom.xml

# Apicurio Registry (the Avro source's tests): a Quarkus application, so Maven fetches it and runs
# Quarkus's build of it (scripts/schema-registry/pom.xml) into airflow_eos.embedded.schema_registry_home().
registry_version=$(pom_version scripts/schema-registry/pom.xml apicurio.version)
registry_home=$(cache_home EOS_SCHEMA_REGISTRY_HOME "schema-registry-$registry_version")
fill_once "$registry_home" build "building Apicurio Registry $registry_version with Maven (~2 min)" \
  mvn -q -B -f scripts/schema-registry/pom.xml package -DskipTests -Dregistry.build.dir="$registry_home/build"

# Apache Iceberg's REST catalog test server (the Iceberg target's tests on a REST catalog):
# airflow_eos.embedded.iceberg_rest_home().
iceberg_version=$(pom_version scripts/iceberg-rest/pom.xml iceberg.version)
fetch_jars "$(cache_home EOS_ICEBERG_REST_HOME "iceberg-rest-$iceberg_version")" \
  "Apache Iceberg $iceberg_version's REST catalog server jars" scripts/iceberg-rest/pom.xml
