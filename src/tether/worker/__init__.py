"""Running jobs: the ``Worker`` (``loop``) composed of a producer that claims, an executor that
runs handlers, a completer that decides and records outcomes and a supervisor that watches over
them; periodic jobs (``schedule``, ``cron``); retry backoff (``retry``)."""
