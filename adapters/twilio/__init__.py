"""Twilio: SMS and WhatsApp by signed webhooks in, the Messages REST API out (twilio SDK)."""
