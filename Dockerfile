# Roost service image: `docker run -e ANTHROPIC_API_KEY=... -e TELEGRAM_BOT_TOKEN=... -v roost-data:/data roost`
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    ROOST_DATA_DIR=/data

RUN useradd --create-home --uid 10001 roost \
    && mkdir /data && chown roost:roost /data

WORKDIR /opt/roost
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY channels ./channels
COPY plugins ./plugins
COPY workspaces ./workspaces
RUN pip install .

USER roost
# roost.toml is read from the working directory; mount one here if you use it.
WORKDIR /home/roost
VOLUME ["/data"]

CMD ["roost", "run"]
