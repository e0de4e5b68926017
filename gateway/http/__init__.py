"""Herald's HTTP server: API, webhooks, health and metrics."""
