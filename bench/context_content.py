"""What the context bench talks about: targets, sizes, and the realistic questions,
tool outputs and replies of its scripted conversation."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Callable
from typing import Any

# -- targets and sizes -----------------------------------------------------------

TURNS = 200
CHARS_PER_TOKEN = 4
"""Fixed conversion for part 1, the same for Roost and the naive baseline."""
TOOL_OUTPUT_CHARS = (5_000, 20_000)
TARGET_FIRST_REQUEST_BYTES = 16 * 1024
PEER_FIRST_REQUEST = "34 KB and 57 KB"
CALIBRATION_PASSES = 20
"""Passes over a category's calibration half in part 3, enough for the EWMA to settle."""
CALIBRATION_REQUESTS = 300
"""Synthetic mixed requests for the run-loop-like calibration in part 3."""
HELD_OUT_REQUESTS = 100
"""Synthetic mixed requests, from the held-out items, measured whole in part 3."""
PROMPT_CATEGORY = "Roost 1st prompt+tools"

USER_ID = "u1"
USER_NAME = "Dana"
TOOL_NAME = "lookup"

# Real tokenizer data (part 3).
TIKTOKEN_SHA256 = {
    # The hashes tiktoken_ext.openai_public pins for the files it downloads.
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
CLAUDE_SDK_VERSION = "0.38.0"
CLAUDE_WHEEL_SHA256 = "2c8117b53da7051d8ab65f4e8e05925bd53c53380183115802ace77bde14d4eb"
CLAUDE_TOKENIZER_SHA256 = "c241737df24b4e7f7c9af4fdcee29a0ca903dcb288a8b753bc346a3092911767"


# -- realistic content ------------------------------------------------------------

SENTENCES = (
    "The migration adds a nullable column first and backfills it in batches of 10,000 rows.",
    "Customers on the legacy plan keep their current price until the end of the billing "
    "cycle.",
    "We saw a spike in 502 responses right after the load balancer rotated its certificates.",
    "The retry policy now waits 250 ms, then 500 ms, then gives up and reports the error.",
    "Support asked whether the export can include archived projects as well.",
    "Latency at the 99th percentile dropped from 840 ms to 310 ms after the cache change.",
    "The vendor confirmed the outage was caused by a misconfigured DNS record on their side.",
    "Nobody owns the nightly job anymore, so failures have gone unnoticed for two weeks.",
    "The new onboarding flow cut the time to first message from four minutes to ninety "
    "seconds.",
    "Finance wants the quarterly numbers split by region and by product line.",
    "The test suite is flaky on CI because two tests share a temporary directory.",
    "If the token expires during an upload, the client should refresh it and resume.",
    "Legal reviewed the data processing agreement and asked for two small changes.",
    "Warehouse capacity in the north is at 93%, so new stock goes to the southern site.",
    "The design team prefers the darker palette, but it fails the contrast check on buttons.",
    "Most of the cost comes from egress traffic between the two availability zones.",
    "Users on Android 12 report that notifications arrive several minutes late.",
    "The proposal is to deprecate version 1 of the API in March and remove it in September.",
    "A rollback is possible, but the schema change cannot be reverted without downtime.",
    "Three enterprise customers asked for single sign-on before they renew.",
    "The incident review found no data loss, only delayed processing of about 4,200 events.",
    "Memory usage grows by roughly 30 MB per hour, which points to a leak in the worker.",
    "The contract renews automatically unless we give notice 60 days in advance.",
    "Search results now rank exact title matches above partial matches in the body.",
    "The mobile team will ship the fix in the next release, planned for Thursday.",
    "Shipping to Canada takes five to seven business days with the standard carrier.",
    "The spreadsheet double-counts refunds that were issued in the same month as the sale.",
    "We agreed to freeze new features for two weeks and focus on stability.",
    "The audit log keeps entries for 400 days, which exceeds the policy by 35 days.",
    "Please review the pull request before Friday so it makes it into the release branch.",
)

TITLES = ("Crash when uploading files larger than 2 GB", "Dark mode toggle resets after login",
          "Webhook retries ignore the Retry-After header", "CSV export drops the last row",
          "Slow query on the orders dashboard", "Password reset email goes to spam",
          "Timezone offset wrong for Australia/Adelaide", "Memory leak in background worker",
          "Search ignores accented characters", "Rate limiter counts failed requests twice",
          "Invoice PDF cuts off long addresses", "Session expires while typing a long reply",
          "Flaky test: test_sync_conflict_resolution", "Add SSO via SAML for enterprise plans",
          "Mobile push notifications arrive late", "Broken link in onboarding checklist")
LABELS = ("bug", "regression", "p1", "p2", "needs-triage", "backend", "frontend", "mobile",
          "release-blocker", "good first issue", "security", "performance")
LOGINS = ("mkowalski", "ana-sousa", "jchen42", "priya-r", "tobias.w", "lea_martin", "okafor-dev",
          "sato-k", "dgreen", "fatima-h")
SERVICES = ("api-gateway", "billing", "search", "auth", "notifications", "export-worker")
PATHS = ("/v1/orders", "/v1/orders/{id}", "/v1/users/{id}/sessions", "/v1/search",
         "/v1/invoices/{id}/pdf", "/v1/webhooks/deliveries", "/healthz")
LOG_MESSAGES = ("request completed", "cache miss, loading from database", "upstream timeout",
                "retrying request", "token refreshed", "slow query detected",
                "connection pool exhausted, waiting", "job finished", "payload validated")
HEADINGS = ("Overview", "Background", "How it works", "Pricing", "Limits and quotas",
            "Migration guide", "Known issues", "Frequently asked questions", "Security",
            "Changelog", "Next steps")
PRODUCTS = ("Widget Pro", "Widget Lite", "Sensor Kit", "Cloud Plan S", "Cloud Plan M",
            "Cloud Plan L", "Support Add-on", "Training Day")
REGIONS = ("EMEA", "North America", "LATAM", "APAC")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")

QUESTIONS = (
    ("Pull the open issues labelled {label} in {repo} and tell me which ones block the {ver} "
     "release."),
    "Check the {service} logs from {when}: any errors or slow requests I should worry about?",
    "Read the docs page on {topic} and summarize what matters for our team.",
    "Get the {region} sales for {month} and compare them with the month before.",
)
TOPICS = ("webhook retries", "SSO setup", "data retention", "rate limits", "the v2 API migration",
          "usage-based pricing", "audit logs", "regional data residency")
WHENS = ("this morning", "last night", "the last two hours", "yesterday afternoon")

REPLIES = (
    "Three of the open issues block the release: the webhook retry bug (it ignores "
    "Retry-After and hammers slow endpoints), the CSV export that drops its last row, and "
    "the session expiry while typing. The first two have owners and linked pull requests; "
    "the session one has nobody assigned yet. The rest are p2 or cosmetic and can wait. "
    "Want me to draft a note to the team asking for an owner on the session issue?",
    "Mostly healthy. I see a burst of upstream timeouts between 09:12 and 09:19 UTC on "
    "/v1/search (about 40 requests, all retried successfully) and a handful of slow queries "
    "on the orders dashboard, the slowest at 2.4 s. There is one real error: the export "
    "worker hit 'connection pool exhausted' twice and one job failed. Nothing looks like "
    "data loss. I would raise the pool size or check for a leaked connection in the worker.",
    "The short version: the feature is available on all paid plans, it is configured per "
    "workspace, and there are two limits to know about (requests per minute and payload "
    "size). The migration guide recommends switching over before the old endpoint is "
    "removed in September. The known-issues section mentions a timezone bug that would "
    "affect our Australian customers, so that is worth tracking.",
    "Sales were up about 8% on the previous month, driven mostly by Cloud Plan M and the "
    "Sensor Kit. Widget Lite was down for the third month in a row. Refunds were higher "
    "than usual in the second half of the month, mainly one large customer. If you want, "
    "I can put the numbers into a small table in a file in your workspace.",
)

SUMMARY_TEXT = (
    "- Dana works on release and operations for a B2B SaaS product; asks in short "
    "questions and wants findings first, details after.\n"
    "- Release: three issues were flagged as blockers (webhook retries ignoring Retry-After, "
    "CSV export dropping the last row, session expiry while typing). Two have owners and "
    "open pull requests; the session issue still needs an owner. Dana agreed to ask the "
    "team lead about it. Everything labelled p2 waits for the next release.\n"
    "- Operations: api-gateway and search logs showed short bursts of upstream timeouts "
    "(all retried successfully). The export worker twice ran out of database connections "
    "and one export job failed; suggested raising the pool size or looking for a leaked "
    "connection. Billing logs were clean. Memory of the background worker grows about "
    "30 MB/hour; a leak is suspected but not confirmed.\n"
    "- Docs read and summarized: webhook retries, SSO setup, data retention, rate limits, "
    "v2 API migration (old endpoint removed in September; switch before then), "
    "usage-based pricing. A timezone bug in the docs' known issues affects Australian "
    "customers: worth tracking.\n"
    "- Sales: month-on-month growth of 5-9% in most regions, driven by Cloud Plan M and the "
    "Sensor Kit; Widget Lite declining for three months; refunds elevated because of one "
    "large customer in EMEA. LATAM flat. Dana may want a table of the numbers in a "
    "workspace file (offered, not yet asked for).\n"
    "- Open promises: draft a note asking for an owner of the session-expiry issue when "
    "Dana asks; keep checking export-worker errors in future log reviews.\n"
    "- Files touched: memory notes only (memory/ dated file)."
)
FLUSH_NOTE = ("- Dana: release/ops for a B2B SaaS; wants findings first.\n"
              "- Open: owner needed for the session-expiry release blocker.\n"
              "- Watch: export-worker connection pool errors; worker memory growth.\n")


def kind_of(turn: int) -> int:
    """Which of the four kinds (JSON, logs, page, CSV) turn ``turn`` (1-based) is."""
    return (turn - 1) % 4


def question(turn: int) -> str:
    rng = random.Random(turn)
    text = QUESTIONS[kind_of(turn)].format(
        label=rng.choice(LABELS), repo=rng.choice(("acme/web", "acme/api", "acme/mobile")),
        ver=f"4.{rng.randint(1, 19)}", service=rng.choice(SERVICES), when=rng.choice(WHENS),
        topic=rng.choice(TOPICS), region=rng.choice(REGIONS), month=rng.choice(MONTHS))
    return f"Q{turn}: {text}"


def _prose(rng: random.Random, sentences: int) -> str:
    return " ".join(rng.choice(SENTENCES) for _ in range(sentences))


def _stamp(rng: random.Random) -> str:
    base = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
    moment = base + dt.timedelta(seconds=rng.randint(0, 90 * 86_400))
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_output(rng: random.Random, target: int) -> str:
    pretty = rng.random() < 0.5
    items: list[dict[str, Any]] = []
    size = 0
    while size < target:
        number = rng.randint(100, 9_999)
        item = {
            "id": rng.randint(10**9, 10**10), "number": number, "title": rng.choice(TITLES),
            "state": rng.choice(("open", "open", "closed")),
            "labels": rng.sample(LABELS, rng.randint(1, 3)),
            "user": {"login": rng.choice(LOGINS), "id": rng.randint(10**5, 10**8),
                     "type": "User"},
            "assignees": [rng.choice(LOGINS) for _ in range(rng.randint(0, 2))],
            "comments": rng.randint(0, 40), "created_at": _stamp(rng),
            "updated_at": _stamp(rng),
            "html_url": f"https://git.example.com/acme/api/issues/{number}",
            "body": _prose(rng, rng.randint(2, 5)),
        }
        items.append(item)
        size += len(json.dumps(item, indent=2 if pretty else None)) + 4
    doc = {"total_count": len(items) + rng.randint(0, 40), "incomplete_results": False,
           "items": items}
    return json.dumps(doc, indent=2 if pretty else None)


def _log_output(rng: random.Random, target: int) -> str:
    lines: list[str] = []
    size = 0
    while size < target:
        level = rng.choices(("INFO", "WARN", "ERROR", "DEBUG"), (70, 15, 5, 10))[0]
        path = rng.choice(PATHS).replace("{id}", str(rng.randint(1_000, 99_999)))
        line = (f"{_stamp(rng)[:-1]}.{rng.randint(0, 999):03d}Z {level:<5} "
                f"{rng.choice(SERVICES)} {rng.choice(LOG_MESSAGES)} method="
                f"{rng.choice(('GET', 'GET', 'POST', 'PUT', 'DELETE'))} path={path} "
                f"status={rng.choice((200, 200, 200, 201, 204, 404, 429, 500, 502))} "
                f"duration_ms={rng.randint(2, 2_500)} request_id={rng.getrandbits(64):016x}")
        if level == "ERROR":
            line += ("\nTraceback (most recent call last):\n  File \"/app/worker/jobs.py\", "
                     f"line {rng.randint(20, 400)}, in run\n    result = await handler(payload)"
                     "\n  File \"/app/worker/db.py\", line 88, in acquire\n    raise "
                     "PoolTimeout(\"connection pool exhausted\")\nPoolTimeout: connection "
                     "pool exhausted")
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _page_output(rng: random.Random, target: int) -> str:
    parts = [f"# {rng.choice(TOPICS).capitalize()}\n\n{_prose(rng, 3)}"]
    size = len(parts[0])
    while size < target:
        block = f"## {rng.choice(HEADINGS)}\n\n{_prose(rng, rng.randint(3, 6))}"
        if rng.random() < 0.4:
            block += "\n\n" + "\n".join(f"- {rng.choice(SENTENCES)}"
                                        for _ in range(rng.randint(2, 5)))
        parts.append(block)
        size += len(block) + 2
    return "\n\n".join(parts)


def _csv_output(rng: random.Random, target: int) -> str:
    lines = ["date,region,product,units,unit_price,revenue,currency,refunds"]
    size = len(lines[0])
    while size < target:
        units = rng.randint(1, 400)
        price = rng.choice((19.0, 49.0, 99.0, 249.0, 1200.0)) * rng.uniform(0.9, 1.1)
        line = (f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},"
                f"{rng.choice(REGIONS)},{rng.choice(PRODUCTS)},{units},{price:.2f},"
                f"{units * price:.2f},{rng.choice(('EUR', 'USD', 'GBP'))},"
                f"{rng.choice((0, 0, 0, 1, 2))}")
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


GENERATORS: tuple[Callable[[random.Random, int], str], ...] = (
    _json_output, _log_output, _page_output, _csv_output)


def tool_output(turn: int) -> str:
    """The bench tool's result for turn ``turn``: 5-20 KB, deterministic."""
    rng = random.Random(turn * 7_919 + 17)
    target = rng.randint(*TOOL_OUTPUT_CHARS)
    return GENERATORS[kind_of(turn)](rng, target)
