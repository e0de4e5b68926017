"""Several Herald instances on one database: membership, leases, session lanes, signals.

SQLite serves one instance (`Solo*` classes: everything local). On PostgreSQL every instance
registers with a heartbeat; singleton work (a poller, a mailbox connection, the scheduler)
runs under a lease with a fencing token; a session's turns run on the instance holding its
lane; LISTEN/NOTIFY carries busy-mode signals to that instance.
"""
