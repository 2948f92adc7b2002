# Roost service image.
#   docker build -t roost .
#   docker run --env-file .env -v roost-data:/data -p 8080:8080 roost
# Behind a private package index (a mirror, a proxy), pass it to the build stage:
#   docker build --build-arg PIP_INDEX_URL=https://pypi.internal/simple \
#                --build-arg PIP_TRUSTED_HOST=pypi.internal -t roost .
# (PIP_EXTRA_INDEX_URL works the same way.) pip reads these from the environment;
# they exist only in the build stage, so no index credential reaches the image.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY roost ./roost
COPY bot ./bot
COPY channels ./channels
COPY plugins ./plugins
COPY workspaces ./workspaces
# Every platform SDK, the OTLP exporter and the PostgreSQL driver (the `all` extra;
# ROOST_DATABASE_URL=postgresql://...), in a venv the runtime stage copies whole:
# no compiler or build files in the final image.
RUN python -m venv /opt/roost \
    && /opt/roost/bin/pip install --no-cache-dir ".[all]"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/roost/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ROOST_DATA_DIR=/data \
    ROOST_PLUGINS_DIR=/data/plugins \
    ROOST_HTTP_HOST=0.0.0.0 \
    ROOST_HTTP_PORT=8080
# A fixed numeric uid, so a bind-mounted /data can be chown'ed to it on the host.
RUN useradd --create-home --uid 10001 --user-group roost \
    && mkdir -p /data/plugins \
    && chown -R 10001:10001 /data
COPY --from=build /opt/roost /opt/roost
USER 10001:10001
# roost.toml and .env are read from the working directory: mount them here.
WORKDIR /home/roost
VOLUME ["/data"]
EXPOSE 8080
# /healthz answers 200 while the process is alive (readiness is /readyz).
# The slim image has no curl; Python is there anyway.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('ROOST_HTTP_PORT', '8080'), timeout=4)"]
CMD ["roost", "run"]
