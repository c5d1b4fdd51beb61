#!/bin/bash
# `executor`: Spark's Kubernetes executor. Anything else runs as given.
set -euo pipefail

if [[ "${1:-}" != executor ]]; then
  exec "$@"
fi

# A passwd entry for a uid without one (a uid the platform assigns, where the runtime adds
# no entry), which the JVM and Hadoop's login need: what spark_checkpoint.user_entry prints.
exports="$(python -P -m spark_checkpoint.user_entry)"  # -P: not from the working directory
eval "${exports}"

# The class path as Spark's own entrypoint builds it: configuration first, then the extra
# class path of spark.executor.extraClassPath (SPARK_CLASSPATH), Spark's jars, the working
# directory (SPARK-43540).
classpath="${SPARK_CONF_DIR:-${SPARK_HOME}/conf}"
classpath+="${HADOOP_CONF_DIR:+:${HADOOP_CONF_DIR}}"
classpath+="${SPARK_CLASSPATH:+:${SPARK_CLASSPATH}}"
classpath+=":${SPARK_HOME}/jars/*"
classpath+="${SPARK_EXTRA_CLASSPATH:+:${SPARK_EXTRA_CLASSPATH}}"
classpath+=":${PWD}"
classpath+="${SPARK_DIST_CLASSPATH:+:${SPARK_DIST_CLASSPATH}}"

# The JVM options Spark passes as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ..., in that order.
java_options=()
while IFS= read -r name; do
  java_options+=("${!name}")
done < <(compgen -v SPARK_JAVA_OPT_ | sort -t _ -k 4 -n)

exec tini -s -- "${JAVA_HOME}/bin/java" "${java_options[@]}" \
  -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
  -cp "${classpath}" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "${SPARK_DRIVER_URL}" \
  --executor-id "${SPARK_EXECUTOR_ID}" \
  --cores "${SPARK_EXECUTOR_CORES}" \
  --app-id "${SPARK_APPLICATION_ID}" \
  --hostname "${SPARK_EXECUTOR_POD_IP}" \
  --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
  --podName "${SPARK_EXECUTOR_POD_NAME}"
