# syntax=docker/dockerfile:1
# The images of spark-checkpoint-operator, two targets of one file:
#
#   docker build --target operator -t ghcr.io/spark-checkpoint/operator:0.1.0 .
#   docker build --target spark    -t ghcr.io/spark-checkpoint/spark:0.1.0 .
#
# operator: the Kopf operator (charts/spark-checkpoint-operator runs it). No pyspark, no Java.
# spark:    the image user pipelines build on (FROM it, COPY the pipeline): Python, Java 17,
#           PySpark and `spark_checkpoint`; the reference word count is in
#           /opt/spark-checkpoint/examples/wordcount/. The operator starts driver and cleanup
#           pods with an explicit command (`python <mainFile> ...`,
#           `python -m spark_checkpoint.janitor ...`); Spark starts executor pods from the same
#           image with the single argument `executor`, which the entrypoint turns into the JVM
#           executor. Any other command runs as given.
#
# Builds with BuildKit (Docker's default builder since Docker 23; `COPY --chmod` needs it) and
# with Buildah 1.28 (Debian bookworm's; `buildah bud --layers`, as the tests build it): it
# keeps to what both read alike (no heredocs, which Buildah 1.28 does not read, and no
# `RUN --mount=from=...`, whose cached layer Buildah 1.28 reuses after the mounted files change). tests/image/test_dockerfile.py lints this file with
# hadolint and checks it against the repository (pins, users, paths, the executor
# entrypoint); tests/image/test_containers.py builds both targets here and runs them.

# ---------------------------------------------------------------------------------------------
# base: the one base image of every stage, the runtime user, Python's settings.
#
# The official Python image, pinned by version tag. A digest
# (python:3.11.15-slim-bookworm@sha256:...) would pin it harder, but none could be resolved
# where this file was written (no registry access): append the digest of the tag's
# multi-platform index when building from a trusted network. BASE_IMAGE replaces it with an
# image that has what this file uses of it: Debian bookworm with apt, bash and useradd, and
# Python 3.11 whose `python` and `pip` in /usr/local/bin install into
# /usr/local/lib/python3.11/site-packages (tests/helpers/containers.py assembles such a
# stand-in from Debian's packages where no image registry can be reached).
ARG BASE_IMAGE=python:3.11.15-slim-bookworm
FROM ${BASE_IMAGE} AS base

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# No bytecode written at run time (the operator runs with a read-only root filesystem; pip
# compiles the installed packages at install time), unbuffered logs, quiet and cache-less pip.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore

# One numeric non-root user for both images (the chart's runAsUser/runAsGroup: 10001), with
# a home for what Spark and Ivy keep there in the spark image.
RUN groupadd --system --gid 10001 sparkcheckpoint \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/sparkcheckpoint \
        --create-home --shell /usr/sbin/nologin sparkcheckpoint

# ---------------------------------------------------------------------------------------------
# builder: the project's wheel, built once, installed by both runtime stages.
FROM base AS builder

# The build backend, pinned (pyproject.toml asks for setuptools>=69; its SPDX `license`
# string needs 77 or newer), instead of whatever build isolation would fetch.
RUN pip install --no-cache-dir setuptools==84.2.1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY spark_app/ spark_app/
# The CRD: the package links to it and the wheel ships it as package data.
COPY crds/ crds/
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# ---------------------------------------------------------------------------------------------
# deps: the project's runtime dependencies, every one pinned (the whole closure, not only what
# pyproject.toml names), before any of the project's code so that a code change rebuilds
# only the small layers after this one. This list is the lock: the Makefile installs the
# development environment with it as pip constraints, so the test suite runs these versions;
# tests/image checks that they cover that closure and satisfy pyproject.toml's ranges.
FROM base AS deps

RUN pip install --no-cache-dir \
        aiohappyeyeballs==2.7.1 \
        aiohttp==3.14.5 \
        aiohttp-retry==2.9.1 \
        aiosignal==1.4.0 \
        annotated-doc==0.0.7 \
        annotated-types==0.8.0 \
        attrs==26.1.0 \
        certifi==2026.10.19.post1 \
        charset-normalizer==3.5.3 \
        click==8.5.1 \
        common-expression-language==0.10.0 \
        croniter==6.2.4 \
        durationpy==0.11 \
        frozenlist==1.8.0 \
        fsspec==2026.9.0 \
        idna==3.20 \
        iso8601==2.1.0 \
        jsonpatch==1.47 \
        jsonpointer==3.12 \
        jsonschema==4.26.0 \
        jsonschema-specifications==2025.9.1 \
        kopf==1.45.2 \
        kubernetes==37.0.1 \
        markdown-it-py==4.3.0 \
        mdurl==0.1.2 \
        multidict==7.2.1 \
        oauthlib==4.0.1 \
        prometheus-client==0.26.0 \
        prompt-toolkit==3.0.53 \
        propcache==0.5.4 \
        pydantic==2.14.3 \
        pydantic-core==2.50.4 \
        pygments==2.21.0 \
        python-dateutil==2.9.0.post0 \
        python-json-logger==4.2.0 \
        pyyaml==6.0.3 \
        referencing==0.37.0 \
        requests==2.34.2 \
        requests-oauthlib==2.0.0 \
        rich==15.0.0 \
        rpds-py==2026.9.1 \
        shellingham==1.5.4 \
        six==1.17.0 \
        typer==0.29.2 \
        typing-extensions==4.16.0 \
        typing-inspection==0.4.5 \
        urllib3==2.8.0 \
        wcwidth==0.9.4 \
        websocket-client==1.9.2 \
        yarl==1.25.1

# ---------------------------------------------------------------------------------------------
# spark: Python 3.11, Java 17, PySpark and the project with its `spark` extra.
FROM deps AS spark

# Debian bookworm's Java 17 runtime (bookworm-security's build as of 2026), tini, the init
# Spark's own images run executors under, and libnss-wrapper, which gives an arbitrary uid
# without a passwd entry one (a uid the platform assigns, as OpenShift's SCCs do, where the
# runtime adds no entry, as containerd: the JVM and Hadoop's login need one;
# spark_checkpoint/user_entry.py). A pinned Debian version disappears from the
# archive once superseded: when `apt-get install` says "Version ... not found", take the
# new one from `apt-cache policy openjdk-17-jre-headless` in the base image. The slim base
# drops /usr/share/man, where the JRE's postinst links its man pages (created empty first).
# JAVA_HOME is a link of our own, so that it is the same path on amd64 and arm64.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libnss-wrapper=1.1.12-1 \
        openjdk-17-jre-headless=17.0.21.1+2-1~deb12u1 \
        tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17 \
    && /usr/lib/jvm/java-17/bin/java -version

# HOME: the home of the image's user for any uid too (a runtime sets HOME from the passwd
# entry, or to / where the uid has none).
ENV HOME=/home/sparkcheckpoint \
    JAVA_HOME=/usr/lib/jvm/java-17 \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark

# PySpark (the pyproject.toml `spark` extra's pin) and its one dependency. Its jars, the
# Kubernetes scheduler backend among them, are what the executor entrypoint runs. Then
# pandas (below 3, which PySpark 4.3 does not support) and pyarrow for PySpark's
# pandas-based APIs (applyInPandasWithState, transformWithStateInPandas: it also needs
# protobuf, 6.x, which its generated StateMessage_pb2 was made by), with their
# dependencies (what the Kubernetes client shares with them is in the deps stage); the
# Makefile's constraints take these lines as they take the deps stage's.
# Then the fsspec filesystems for checkpoint storage on object stores, s3fs (s3://), adlfs
# (abfs://, az://) and gcsfs (gs://), with their dependencies (botocore holds
# python-dateutil below 3).
# Only this image has them: the operator never touches storage.
RUN pip install --no-cache-dir pyspark==4.3.0 py4j==0.10.9.9 \
        pandas==2.3.3 \
        pyarrow==26.0.1 \
        protobuf==6.33.6 \
        numpy==2.4.6 \
        pytz==2026.6 \
        tzdata==2026.6 \
        s3fs==2026.9.0 \
        aiobotocore==3.10.0 \
        aioitertools==0.13.0 \
        botocore==1.43.117 \
        jmespath==1.1.0 \
        wrapt==2.5.2 \
        adlfs==2026.8.0 \
        azure-core==1.41.0 \
        azure-identity==1.27.0 \
        azure-storage-blob==12.31.1 \
        cffi==2.1.1 \
        cryptography==50.0.2 \
        isodate==0.7.2 \
        msal==1.39.0 \
        msal-extensions==1.3.1 \
        pycparser==3.12 \
        pyjwt==2.15.1 \
        gcsfs==2026.10.1 \
        decorator==5.3.2 \
        google-api-core==2.44.0 \
        google-auth==2.63.0 \
        google-auth-oauthlib==1.5.0 \
        google-cloud-core==2.8.0 \
        google-cloud-storage==3.17.1 \
        google-cloud-storage-control==1.17.0 \
        google-crc32c==1.9.0 \
        google-resumable-media==2.11.0 \
        googleapis-common-protos==1.76.0 \
        grpc-google-iam-v1==0.14.6 \
        grpcio==1.85.3 \
        grpcio-status==1.85.3 \
        opentelemetry-api==1.45.3 \
        proto-plus==1.29.0 \
        pyasn1==0.6.5 \
        pyasn1-modules==0.4.2 \
    && test -f "${SPARK_HOME}/jars/spark-kubernetes_2.13-4.3.0.jar" \
    && python -c "import pandas, pyarrow, s3fs, adlfs, gcsfs" \
    && python -c "import pyspark.sql.streaming.proto.StateMessage_pb2"

COPY --from=builder /wheels/ /tmp/wheels/
RUN pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && pip check \
    && python -c "import pyspark, spark_checkpoint.driver, spark_checkpoint.janitor"

# The executor entrypoint (container/spark-entrypoint.sh), after Spark's own
# (resource-managers/kubernetes/docker in Spark's sources), reduced to the executor: Spark's
# executor pods pass `executor` and the executor's settings in SPARK_* variables.
COPY --chmod=0755 container/spark-entrypoint.sh /opt/spark-checkpoint/bin/entrypoint.sh

# The reference pipeline, where tests/cluster expects it
# (mainFile local:///opt/spark-checkpoint/examples/wordcount/pipeline.py). Its generated
# data/ is not part of the image (.dockerignore).
COPY examples/wordcount/ /opt/spark-checkpoint/examples/wordcount/

# A writable working directory: relative paths of a driver (spark-warehouse, derby.log,
# relative input and output arguments) land here. It and the home (Ivy's cache) belong to
# group 0 with the owner's permissions, so an arbitrary uid in group 0 (OpenShift's
# restricted-v2) writes them too.
RUN mkdir -p /opt/spark-checkpoint/work \
    && chown -R 10001:0 /opt/spark-checkpoint/work /home/sparkcheckpoint \
    && chmod -R g=u /opt/spark-checkpoint/work /home/sparkcheckpoint
WORKDIR /opt/spark-checkpoint/work

USER 10001:10001
ENTRYPOINT ["/opt/spark-checkpoint/bin/entrypoint.sh"]
CMD ["python"]

# ---------------------------------------------------------------------------------------------
# operator: the Kopf operator. Writes nothing outside /tmp (the chart mounts an emptyDir
# there and sets readOnlyRootFilesystem). The last stage: a plain `docker build` builds it.
FROM deps AS operator

COPY --from=builder /wheels/ /tmp/wheels/
RUN pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && pip check \
    && python -c "import spark_checkpoint_operator.kubernetes.handlers" \
    && python -c "import importlib.util as u, sys; sys.exit(u.find_spec('pyspark') is not None)"

USER 10001:10001
# The chart overrides the command and arguments (--liveness, --namespace=... or
# --all-namespaces); without it, the operator serves every namespace.
ENTRYPOINT ["spark-checkpoint-operator"]
CMD ["--all-namespaces"]
