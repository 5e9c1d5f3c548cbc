"""Running jobs: the worker loop (``loop``) and retry backoff (``retry``)."""
