"""Email: IMAP IDLE in, SMTP out."""
