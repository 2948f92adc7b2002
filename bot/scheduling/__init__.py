"""Scheduled jobs: cron, interval and one-shot schedules (:mod:`.cron`) and the scheduler
that fires them (:mod:`.scheduler`): which fire times are due (:mod:`.due`), the
APScheduler alarm that wakes it (:mod:`.alarm`), a user's job request checked
(:mod:`.requests`) and one cron job's run with its retries (:mod:`.cron_runs`).
"""
