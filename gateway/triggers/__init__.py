"""Triggers: signed webhooks (`POST /hooks/<name>`) that start agent runs, and outbound
webhooks (`webhook:<name>`) their results are posted to."""
