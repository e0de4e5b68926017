"""Telegram: polling and webhook receivers on python-telegram-bot's `Bot`.

python-telegram-bot 22 warns on every time period it hands out as a number (`RetryAfter`
among them) unless `PTB_TIMEDELTA` opts in to `timedelta`s; the library reads the variable at
each use, so setting it here, before the first request, is enough.
"""

import os

os.environ.setdefault("PTB_TIMEDELTA", "true")
