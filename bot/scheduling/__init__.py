"""Scheduled jobs: cron, interval and one-shot schedules (:mod:`.cron`) and the scheduler
that fires them (:mod:`.scheduler`).
"""
