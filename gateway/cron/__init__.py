"""Scheduled jobs: agent turns run on a schedule, their output delivered as reports.

`schedule` parses schedules and computes fire times (APScheduler 3 triggers), `targets`
resolves where reports go, `store` is the SQL of jobs and runs, `service` the validated
operations the API, CLI, `schedule_job` tool and `/cron` share, `scheduler` the loop that
claims slots and runs them.
"""
