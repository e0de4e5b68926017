"""Slack: Socket Mode or Events API in (dispatched by slack-bolt), the Web API out."""
